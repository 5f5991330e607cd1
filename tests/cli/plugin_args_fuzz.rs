//! The kubectl plugin's command line under arbitrary argument vectors: `Cli::try_parse_from`
//! (what `kubectl-maintenance` runs through `Cli::parse`) never panics, and ends in a parse or
//! in a clap error that says something. No cluster needed.
//!
//! The root crate has no proptest dev-dependency, so the vectors come from a small seeded
//! generator (xorshift); `MO_FUZZ_SEED=<n>` replays another sequence, and a failure prints the
//! seed and the vector.

use std::ffi::OsString;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use maintenance_operator::kubectl::{Cli, Command};

/// Vectors per run: clap parses one in microseconds, so this takes a few seconds.
const CASES: usize = 5_000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Every subcommand, flag and possible value the plugin declares, read from clap itself.
fn vocabulary() -> (Vec<String>, Vec<String>, Vec<String>) {
    let cli = Cli::command();
    let mut subcommands = Vec::new();
    let mut flags = Vec::new();
    let mut values = Vec::new();
    let mut commands = vec![&cli];
    while let Some(command) = commands.pop() {
        for sub in command.get_subcommands() {
            subcommands.push(sub.get_name().to_string());
            subcommands.extend(sub.get_all_aliases().map(str::to_string));
            commands.push(sub);
        }
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long() {
                flags.push(format!("--{long}"));
            }
            if let Some(short) = arg.get_short() {
                flags.push(format!("-{short}"));
            }
            values.extend(
                arg.get_possible_values()
                    .iter()
                    .map(|v| v.get_name().to_string()),
            );
        }
    }
    flags.extend(["--help", "-h", "--version", "-V"].map(str::to_string));
    (subcommands, flags, values)
}

/// Values with a meaning somewhere, and junk.
const VALUES: &[&str] = &[
    "",
    "-",
    "--",
    "=",
    "node-1",
    "node-1,node-2",
    "pool=gpu",
    "pool in (a,b",
    "fw.example.com",
    "a_b",
    "x",
    "0",
    "-1",
    "99999999999999999999",
    "1.5",
    "2026-03-02T01:30:00+01:00",
    "2026-13-45T99:99:99Z",
    "yesterday",
    "1h",
    "90m",
    "-5s",
    "json",
    "yaml",
    "table",
    "wide",
    "true",
    "false",
    "/nonexistent/kubeconfig",
    "über",
    "🛠️",
    "\u{0}",
    "\n",
    "'",
    "\"",
    "$(reboot)",
    "ssh \"$NODE\" true",
];

fn argument(rng: &mut Rng, vocab: &(Vec<String>, Vec<String>, Vec<String>)) -> OsString {
    let (subcommands, flags, values) = vocab;
    match rng.below(12) {
        0 | 1 => rng.pick(subcommands).into(),
        2..=4 => rng.pick(flags).into(),
        5 => format!("{}={}", rng.pick(flags), (*rng.pick(VALUES))).into(),
        6 if !values.is_empty() => rng.pick(values).into(),
        7 => {
            // A short flag cluster such as `-nw` or `-ojson`.
            let shorts: Vec<&String> = flags.iter().filter(|f| f.len() == 2).collect();
            let mut s = String::from("-");
            for _ in 0..=rng.below(3) {
                s.push_str(&rng.pick(&shorts)[1..]);
            }
            if rng.below(2) == 0 {
                s.push_str(VALUES[rng.below(VALUES.len())]);
            }
            s.into()
        }
        8 => {
            // Not UTF-8.
            use std::os::unix::ffi::OsStringExt;
            OsString::from_vec(vec![b'-', b'-', 0xff, 0xfe, b'n'][rng.below(3)..].to_vec())
        }
        9 => "x".repeat(rng.below(10_000)).into(),
        10 => {
            // Random printable and not-so-printable characters.
            (0..rng.below(12))
                .map(|_| char::from_u32(rng.below(0x3000) as u32).unwrap_or('?'))
                .collect::<String>()
                .into()
        }
        _ => (*rng.pick(VALUES)).into(),
    }
}

fn seed() -> u64 {
    std::env::var("MO_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_cafe_f00d_0001)
}

#[test]
fn arbitrary_argument_vectors_parse_or_fail_with_a_message() {
    let vocab = vocabulary();
    assert!(vocab.0.contains(&"request".to_string()), "{:?}", vocab.0);
    assert!(
        vocab.1.contains(&"--namespace".to_string()),
        "{:?}",
        vocab.1
    );
    let seed = seed();
    let mut rng = Rng(seed);
    let started = std::time::Instant::now();
    let (mut parsed, mut refused) = (0, 0);
    for case in 0..CASES {
        let len = rng.below(8);
        let mut args: Vec<OsString> = vec!["kubectl-maintenance".into()];
        // Most vectors start with a subcommand, as people type them.
        if rng.below(4) != 0 {
            args.push(rng.pick(&vocab.0).into());
        }
        args.extend((0..len).map(|_| argument(&mut rng, &vocab)));
        let shown = || {
            let mut v: Vec<String> = args
                .iter()
                .map(|a| a.to_string_lossy().chars().take(60).collect())
                .collect();
            v.truncate(12);
            format!("seed {seed}, case {case}: {v:?}")
        };
        let outcome = std::panic::catch_unwind(|| Cli::try_parse_from(args.clone()));
        match outcome {
            Err(_) => panic!("try_parse_from panicked on {}", shown()),
            Ok(Ok(cli)) => {
                parsed += 1;
                // A parse names one of the subcommands, and it was on the command line.
                let name = match &cli.command {
                    Command::Request(_) => "request",
                    Command::Status(_) => "status",
                    Command::Plan(_) => "plan",
                    Command::Preflight(_) => "preflight",
                    Command::Rollout(_) => "rollout",
                };
                assert!(
                    args.iter().any(|a| a == name),
                    "parsed {name} without it on {}",
                    shown()
                );
            }
            Ok(Err(error)) => {
                refused += 1;
                let rendered = error.render().to_string();
                assert!(
                    !rendered.trim().is_empty(),
                    "an empty clap message on {}",
                    shown()
                );
                match error.kind() {
                    ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {}
                    kind => {
                        // A real error: clap's `error:` line, and a pointer to --help.
                        assert!(
                            rendered.starts_with("error:"),
                            "{kind:?} without `error:` on {}: {rendered}",
                            shown()
                        );
                        assert!(
                            rendered.contains("--help") || rendered.contains("Usage:"),
                            "{kind:?} without usage or --help on {}: {rendered}",
                            shown()
                        );
                    }
                }
            }
        }
    }
    eprintln!(
        "{CASES} vectors (seed {seed}): {parsed} parsed, {refused} refused, in {:.2?}",
        started.elapsed()
    );
    assert!(parsed > 0, "no vector parsed: the generator is off");
}

/// Edge cases written out: empty vectors, lone separators, and flags without their values.
#[test]
fn edge_vectors_do_not_panic() {
    let vectors: &[&[&str]] = &[
        &[],
        &["kubectl-maintenance"],
        &["kubectl-maintenance", "--"],
        &["kubectl-maintenance", "-"],
        &["kubectl-maintenance", "-n"],
        &["kubectl-maintenance", "--namespace="],
        &["kubectl-maintenance", "plan", "--at"],
        &["kubectl-maintenance", "plan", "--at", "not-a-time"],
        &["kubectl-maintenance", "plan", "-o", "xml"],
        &[
            "kubectl-maintenance",
            "plan",
            "--from-file",
            "-",
            "--from-file",
            "-",
        ],
        &["kubectl-maintenance", "request"],
        &["kubectl-maintenance", "request", "--", "--drain"],
        &["kubectl-maintenance", "rollout", "--exec"],
        &["kubectl-maintenance", "status", "--watch", "--watch"],
        &["kubectl-maintenance", "help", "rollout"],
        &["kubectl-maintenance", "preflight", "--help"],
    ];
    for args in vectors {
        let result = std::panic::catch_unwind(|| Cli::try_parse_from(args.iter()));
        match result {
            Err(_) => panic!("try_parse_from panicked on {args:?}"),
            Ok(Err(e)) => assert!(!e.render().to_string().trim().is_empty(), "{args:?}"),
            Ok(Ok(_)) => {}
        }
    }
}
