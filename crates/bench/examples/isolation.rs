//! The isolation benchmark with its default windows (2 s, 3 repeats), as
//! text; `--json` prints the report as JSON instead. Until the CLI runs
//! it (`fastpath switch bench --part isolation`):
//! `cargo run --release -p bench --example isolation`.

fn main() {
    let opts = bench::isolation::Options {
        progress: true,
        ..bench::isolation::Options::default()
    };
    match bench::isolation::run(&opts) {
        Ok(r) if std::env::args().any(|a| a == "--json") => {
            match serde_json::to_string_pretty(&r) {
                Ok(j) => println!("{j}"),
                Err(e) => {
                    eprintln!("isolation: {e}");
                    std::process::exit(1);
                }
            }
        }
        Ok(r) => print!("{}", r.to_text()),
        Err(e) => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(c) = src {
                s += &format!(": {c}");
                src = c.source();
            }
            eprintln!("isolation: {s}");
            std::process::exit(1);
        }
    }
}
