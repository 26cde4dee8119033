/** `import url from '<file>?url'`: the URL of the file, emitted as is (../webpack.config.js). */
declare module '*?url' {
  const url: string;
  export default url;
}
