//! `specd-tools`: what `specd bench | profile | replay` run.
fn main() {
    specd::cli::exit(specd_tools::cli::main())
}
