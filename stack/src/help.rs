//! `--help` completeness of the project's binaries: every binary says what it is, every argument
//! what it is for. Each binary ends with [`crate::help_test!`], a test calling [`assert_complete`] on its
//! clap command.

use clap::Command;

/// What is missing from `cmd`'s help: `"<about>"` when the command has no description, and the
/// id of every argument (of it and its subcommands) without a help text. Clap's own `--help` and
/// `--version` are not counted.
pub fn missing(cmd: &Command) -> Vec<String> {
    let mut out = Vec::new();
    if cmd.get_about().is_none() && cmd.get_long_about().is_none() {
        out.push(format!("{}: <about>", cmd.get_name()));
    }
    for arg in cmd.get_arguments() {
        let builtin = matches!(arg.get_id().as_str(), "help" | "version");
        if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
            out.push(format!("{}: {}", cmd.get_name(), arg.get_id()));
        }
    }
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        out.extend(missing(sub));
    }
    out
}

/// Fails with the list of [`missing`] help texts; also runs clap's own consistency checks.
pub fn assert_complete(cmd: Command) {
    cmd.clone().debug_assert();
    let missing = missing(&cmd);
    assert!(missing.is_empty(), "{} --help is incomplete: {missing:?}", cmd.get_name());
}

/// [`assert_complete`] on the command of clap parser `P`.
pub fn assert_parser_complete<P: clap::CommandFactory>() {
    assert_complete(P::command());
}

/// A binary's test that its `--help` is complete: `kvroute_stack::help_test!(Args);` at the
/// end of the binary's file, `Args` being its clap parser.
#[macro_export]
macro_rules! help_test {
    ($args:ident) => {
        #[cfg(test)]
        mod help_test {
            #[test]
            fn help_is_complete() {
                $crate::help::assert_parser_complete::<super::$args>();
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use clap::{Arg, Command};

    #[test]
    fn finds_arguments_and_commands_without_help() {
        let cmd = Command::new("x")
            .about("does x")
            .arg(Arg::new("documented").long("documented").help("is documented"))
            .arg(Arg::new("bare").long("bare"))
            .subcommand(Command::new("sub").arg(Arg::new("inner").long("inner")));
        assert_eq!(super::missing(&cmd), ["x: bare", "sub: <about>", "sub: inner"]);
        let fine = Command::new("y").about("does y").arg(Arg::new("a").long("a").help("a"));
        assert!(super::missing(&fine).is_empty());
    }
}
