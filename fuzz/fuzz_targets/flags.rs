//! Command lines of the four sidecars, in the syntax each imitates (Go's `flag` package for the
//! attacher, the registrar and the livenessprobe; pflag for the provisioner), parsed and
//! validated as the start-up does before it starts anything (`sidecar_kit::runtime::main`, the
//! node sidecars' `entry::main`).
//!
//! Properties:
//! - the rewrite changes a word at most by joining a value flag and the next word into
//!   `--name=value` or, in Go syntax, by adding one dash or spelling `-h` as `--help`; it leaves
//!   everything after `--` alone and is idempotent;
//! - for the Go-syntax sidecars, a command line means the same whether its flags are written
//!   `-name` or `--name` (unless a flag is the value of the one before it);
//! - validation (`validate`, the registrar's `plan` under both platforms' rules, the
//!   livenessprobe's `ServePlan`) never panics on anything that parsed;
//! - Go durations agree with an exact integer reading of Go's `time.ParseDuration` (nanosecond
//!   rounding aside), and `Name=bool` feature gates and `k:v` labels never panic.
#![no_main]

use arbitrary::Arbitrary;
use clap::CommandFactory;
use libfuzzer_sys::fuzz_target;
use sidecar_kit::driver::endpoint::Platform;
use sidecar_kit::process::flags::{
    FlagSyntax, feature_gate_pairs, normalize_args, parse_from, parse_go_duration, parse_labels,
};
use sidecar_kit::runtime::SidecarCli;

#[derive(Arbitrary, Debug)]
enum Sidecar {
    Provisioner,
    Attacher,
    Registrar,
    Livenessprobe,
}

#[derive(Arbitrary, Debug)]
enum Word {
    /// A known flag (index into the sidecar's long names), with or without a value.
    Flag {
        name: u8,
        value: Option<String>,
        joined: bool,
    },
    /// Anything else.
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    sidecar: Sidecar,
    words: Vec<Word>,
    duration: String,
    gates: String,
    labels: String,
}

/// Builds the command line with `dashes` before every flag name.
fn command_line(names: &[String], words: &[Word], dashes: &str) -> Vec<String> {
    let mut out = vec!["sidecar".to_string()];
    for word in words {
        match word {
            Word::Flag {
                name,
                value,
                joined,
            } if !names.is_empty() => {
                let name = &names[usize::from(*name) % names.len()];
                match (value, joined) {
                    (None, _) => out.push(format!("{dashes}{name}")),
                    (Some(value), true) => out.push(format!("{dashes}{name}={value}")),
                    (Some(value), false) => {
                        out.push(format!("{dashes}{name}"));
                        out.push(value.clone());
                    }
                }
            }
            Word::Flag { .. } => {}
            Word::Raw(raw) => out.push(raw.clone()),
        }
    }
    out
}

fn long_names(command: &clap::Command) -> Vec<String> {
    command
        .get_arguments()
        .filter_map(|arg| arg.get_long().map(str::to_string))
        .collect()
}

/// Parses and validates as the start-up does; the rendering of the outcome is compared between
/// spellings (clap's error kind only: its messages quote the words as written).
fn outcome(sidecar: &Sidecar, args: &[String], syntax: FlagSyntax) -> String {
    match sidecar {
        Sidecar::Provisioner => {
            match parse_from::<external_provisioner::flags::Cli, _, _>(args, syntax) {
                Ok(cli) => {
                    let _ = cli.removed_flag_warnings();
                    let _ = cli.leader_election();
                    format!("{cli:?} {:?}", cli.validate())
                }
                Err(err) => format!("{:?}", err.kind()),
            }
        }
        Sidecar::Attacher => {
            match parse_from::<external_attacher::flags::Cli, _, _>(args, syntax) {
                Ok(cli) => {
                    format!("{cli:?} {:?}", cli.validate())
                }
                Err(err) => format!("{:?}", err.kind()),
            }
        }
        Sidecar::Registrar => {
            match parse_from::<node_driver_registrar::config::Cli, _, _>(args, syntax) {
                Ok(cli) => {
                    let unix = node_driver_registrar::config::plan(&cli, Platform::Unix);
                    let windows = node_driver_registrar::config::plan(&cli, Platform::Windows);
                    format!("{cli:?} {unix:?} {windows:?}")
                }
                Err(err) => format!("{:?}", err.kind()),
            }
        }
        Sidecar::Livenessprobe => {
            match parse_from::<livenessprobe::flags::Cli, _, _>(args, syntax) {
                Ok(cli) => {
                    let plan = livenessprobe::flags::ServePlan::from_cli(&cli);
                    format!("{cli:?} {plan:?}")
                }
                Err(err) => format!("{:?}", err.kind()),
            }
        }
    }
}

fn check_normalize(args: &[String], command: &clap::Command) {
    for syntax in [FlagSyntax::Go, FlagSyntax::Gnu] {
        let go = syntax == FlagSyntax::Go;
        let normalized = normalize_args(args, syntax, command);
        let mut input = args.iter();
        let mut after_separator = false;
        for after in &normalized {
            let after = after.to_string_lossy();
            let before = input.next().expect("more words out than in");
            if after_separator {
                assert_eq!(before.as_str(), after);
                continue;
            }
            let respelled = go
                && ((matches!(before.as_str(), "-h" | "--h") && after == "--help")
                    || after.strip_prefix('-') == Some(before.as_str()));
            if respelled || before.as_str() == after {
                after_separator = before == "--";
                continue;
            }
            // `--name value` (or in Go syntax `-name value`) became `--name=value`.
            let name = before
                .strip_prefix("--")
                .or_else(|| before.strip_prefix('-').filter(|_| go))
                .unwrap_or_else(|| panic!("{syntax:?}: {before:?} became {after:?}"));
            let value = input.next().expect("a joined value");
            assert!(!name.contains('='), "{before:?} already had a value");
            assert_eq!(after, format!("--{name}={value}"));
        }
        assert!(
            input.next().is_none(),
            "words lost: {args:?} became {normalized:?}"
        );
        assert_eq!(
            normalize_args(normalized.clone(), syntax, command),
            normalized
        );
    }
}

/// Go's `time.ParseDuration` in exact arithmetic: whole nanoseconds times 2^-32 (u128), or
/// `None` where Go fails. Negative values count as failures (the sidecars refuse them).
fn reference_duration(text: &str) -> Option<u128> {
    let mut s = text.strip_prefix('+').unwrap_or(text);
    if s.starts_with('-') {
        return None;
    }
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    const ONE: u128 = 1 << 32;
    let mut total: u128 = 0;
    while !s.is_empty() {
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let (int, rest) = s.split_at(int_len);
        let (frac, rest) = match rest.strip_prefix('.') {
            Some(rest) => {
                let len = rest.bytes().take_while(u8::is_ascii_digit).count();
                rest.split_at(len)
            }
            None => ("", rest),
        };
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
        // Past Go's int64 the value is an error there; the comparison stops caring.
        if int > u128::from(u64::MAX) {
            return Some(u128::MAX);
        }
        total = total.saturating_add(int * scale * ONE);
        // The fraction's first 30 digits are exact enough for a nanosecond comparison.
        let digits = &frac[..frac.len().min(30)];
        if !digits.is_empty() {
            let numerator: u128 = digits.parse().ok()?;
            let denominator = 10u128.pow(digits.len() as u32);
            let scaled = numerator.checked_mul(scale)?.checked_mul(ONE)? / denominator;
            total = total.saturating_add(scaled);
        }
        s = rest;
    }
    Some(total)
}

fn check_duration(text: &str) {
    let parsed = parse_go_duration(text);
    let Some(exact) = reference_duration(text) else {
        assert!(
            parsed.is_err(),
            "{text:?} is no Go duration, parsed as {parsed:?}"
        );
        return;
    };
    let nanos = exact >> 32;
    // Go refuses more than i64::MAX ns; the sidecars' upper limit differs and is not compared.
    if nanos > i64::MAX as u128 {
        return;
    }
    let Ok(parsed) = parsed else {
        panic!("{text:?} is a Go duration of {nanos}ns, refused as {parsed:?}");
    };
    let got = parsed.as_nanos();
    // The parser sums f64s: rounding, and past 2^53 ns lost low bits, are not what this
    // looks for; a wrong unit or digit is off by far more than a part in a billion.
    let tolerance = (nanos >> 30).max(1);
    assert!(
        got.abs_diff(nanos) <= tolerance,
        "{text:?}: Go reads {nanos}ns, parsed {got}ns"
    );
}

fuzz_target!(|input: Input| {
    check_duration(&input.duration);
    let _ = feature_gate_pairs(&input.gates);
    let _ = external_provisioner::flags::parse_feature_gates(&input.gates);
    let _ = external_attacher::flags::parse_feature_gates(&input.gates);
    if let Ok(labels) = parse_labels(&input.labels) {
        assert!(labels.0.iter().all(|(key, _)| !key.is_empty()));
    }

    let (command, syntax) = match input.sidecar {
        Sidecar::Provisioner => (external_provisioner::flags::Cli::command(), FlagSyntax::Gnu),
        Sidecar::Attacher => (external_attacher::flags::Cli::command(), FlagSyntax::Go),
        Sidecar::Registrar => (
            node_driver_registrar::config::Cli::command(),
            FlagSyntax::Go,
        ),
        Sidecar::Livenessprobe => (livenessprobe::flags::Cli::command(), FlagSyntax::Go),
    };
    let names = long_names(&command);
    let double = command_line(&names, &input.words, "--");
    check_normalize(&double, &command);
    let parsed = outcome(&input.sidecar, &double, syntax);
    // A flag written without its value takes the next word as the value, as it is spelled:
    // when that word is itself a flag, the two spellings give different values, in Go too.
    let flag_as_value = input
        .words
        .windows(2)
        .any(|pair| matches!(pair, [Word::Flag { value: None, .. }, Word::Flag { .. }]));
    if syntax == FlagSyntax::Go && !flag_as_value && !double.iter().any(|w| w == "--") {
        let single = command_line(&names, &input.words, "-");
        check_normalize(&single, &command);
        let single_parsed = outcome(&input.sidecar, &single, syntax);
        assert_eq!(parsed, single_parsed, "{double:?} and {single:?} differ");
    }
});
