/** The package's name and version, from package.json: the widget's module and version. */
// eslint-disable-next-line @typescript-eslint/no-require-imports
const pkg = require('../../package.json') as { name: string; version: string };

declare function require(path: string): unknown;

export const MODULE_NAME = pkg.name;
export const MODULE_VERSION = pkg.version;
