//! One module per subcommand.
pub mod target;
