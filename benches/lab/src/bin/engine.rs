//! `engine`: the lab's continuous-batching engine emulator behind an
//! OpenAI-compatible HTTP server with vLLM's `/metrics`, and optionally
//! publishing its load over NATS (`loadgate_lab::serve`).
//!
//! `cargo run --release -p loadgate-lab --bin engine -- --model NAME --port P`;
//! `--help` lists the flags. Exit status 2: a bad command line; 1: the
//! server could not start.

use std::process::ExitCode;

use loadgate_lab::serve::{self, flags, Command};

fn main() -> ExitCode {
    match flags::parse(std::env::args().skip(1)) {
        Ok(Command::Help) => {
            print!("{}", flags::USAGE);
            ExitCode::SUCCESS
        }
        Ok(Command::Serve(options)) => match serve::run(*options) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("engine: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("engine: {e}\n\n{}", flags::USAGE);
            ExitCode::from(2)
        }
    }
}
