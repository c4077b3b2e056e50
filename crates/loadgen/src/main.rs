//! Load generator for agentstore-server (see BENCHMARKS.md).
fn main() {}
