//! The `specd` command.
fn main() {
    let code = match specd::cli::main() {
        Ok(()) => 0,
        Err(e) => {
            // One line, the whole context chain.
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            1
        }
    };
    std::process::exit(code);
}
