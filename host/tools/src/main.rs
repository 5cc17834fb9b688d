//! `specd-tools`: what `specd bench | profile | replay` run.
fn main() {
    let code = match specd_tools::cli::main() {
        Ok(()) => 0,
        Err(e) => {
            // One line, the whole context chain (as `specd` prints errors).
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            1
        }
    };
    std::process::exit(code);
}
