//! specd's measuring tools, apart from the product: the benchmarks
//! (`bench decode | spec | serve | ppl | blas`, and `bench anchors` through
//! `specd-anchors`), the step profiler, trace replay with its charts, and
//! the latency percentiles they report.
//!
//! `specd bench | profile | replay` run this crate's binary, `specd-tools`,
//! from beside `specd` with their arguments as they are; it takes the same
//! global flags (`--weights`, `--kernels`, ...). The data flows one way: this
//! crate uses `specd` (the engine, the scheduler, traces); nothing in
//! `specd` uses it.
pub mod bench;
pub mod cli;
pub mod drafter;
pub mod latency;
pub mod ppl;
pub mod profile;
pub mod replay;
pub mod serve_bench;
