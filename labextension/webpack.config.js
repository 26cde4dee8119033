// Added to @jupyter/builder's configuration (package.json: jupyterlab.webpackConfig).
const { rspack } = require('@rspack/core');

module.exports = {
  module: {
    rules: [
      // `import url from '<file>.js?url'` emits the file beside the bundle, named after it,
      // and gives its URL: BokehJS's own minified build is loaded with a <script> tag
      // (src/bokeh.ts), neither re-bundled nor minified again.
      { resourceQuery: /url/, type: 'asset/resource', generator: { filename: '[name].[contenthash][ext]' } }
    ]
  },
  optimization: {
    // rspack's default minimizers, leaving out the files emitted as they are
    minimizer: [
      new rspack.SwcJsMinimizerRspackPlugin({ exclude: /^bokeh(-api)?\.min\./ }),
      new rspack.LightningCssMinimizerRspackPlugin()
    ]
  }
};
