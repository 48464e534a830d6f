use std::process::ExitCode;

fn main() -> ExitCode {
    gputrace::cli::main()
}
