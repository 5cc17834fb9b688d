//! The `specd` command.
fn main() {
    specd::cli::exit(specd::cli::main())
}
