//! The `fleetscope` command. Everything it does is in the library
//! ([`fleetscope::command::main`]), compiled once there.

fn main() -> std::process::ExitCode {
    fleetscope::command::main()
}
