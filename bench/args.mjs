// Command-line reading shared by the benchmark scripts.

/** The value after `--name` on the command line, or `fallback` when absent. */
export const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : fallback;
};
