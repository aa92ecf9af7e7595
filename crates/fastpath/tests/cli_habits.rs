//! CLI habits: man pages and shell completions generated from
//! the clap definition by `fastpath man` and `fastpath completions`, they
//! must cover every real subcommand and name none that does not exist.
//! The list of real subcommands is read from `--help` itself, level by
//! level, so the test follows the CLI as it grows.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::fastpath;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands `fastpath PATH --help` lists (its "Commands:" section),
/// without clap's `help`.
fn subcommands(path: &[String]) -> Vec<String> {
    let help = run(fastpath().args(path).arg("--help"));
    let mut out = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if line.trim_end() == "Commands:" {
            inside = true;
            continue;
        }
        if inside {
            // Entries are indented by two; descriptions that wrap by more.
            let Some(rest) = line.strip_prefix("  ") else {
                break;
            };
            if rest.starts_with(' ') {
                continue;
            }
            let name = rest.split_whitespace().next().unwrap_or("");
            if !name.is_empty() && name != "help" {
                out.push(name.to_string());
            }
        }
    }
    out
}

/// Every command path under `fastpath`, from `--help` (the root is the
/// empty path).
fn all_commands() -> Vec<Vec<String>> {
    let mut out = vec![Vec::new()];
    let mut i = 0;
    while i < out.len() {
        let path = out[i].clone();
        for s in subcommands(&path) {
            let mut p = path.clone();
            p.push(s);
            out.push(p);
        }
        i += 1;
    }
    out
}

fn page_name(path: &[String]) -> String {
    let mut name = "fastpath".to_string();
    for p in path {
        name.push('-');
        name.push_str(p);
    }
    format!("{name}.1")
}

#[test]
fn man_pages_cover_exactly_the_real_subcommands() {
    let commands = all_commands();
    // The CLI as the help shows it: sanity, so that an empty parse cannot
    // make the test pass.
    for want in [
        &["lb"][..],
        &["lb", "run"],
        &["lb", "status"],
        &["completions"],
        &["man"],
    ] {
        let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        assert!(commands.contains(&want), "{want:?} not in {commands:?}");
    }
    let dir = std::env::temp_dir().join(format!("fastpath-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let listing = run(fastpath().args(["man", "--out"]).arg(&dir));
    let pages: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let expected: BTreeSet<String> = commands.iter().map(|p| page_name(p)).collect();
    assert_eq!(
        pages, expected,
        "man pages (left) and subcommands in --help (right) differ"
    );
    assert!(
        listing.starts_with(&format!("{} man pages in", pages.len())),
        "{listing}"
    );
    for path in &commands {
        let name = page_name(path);
        let text = std::fs::read_to_string(dir.join(&name)).unwrap();
        let title = name.trim_end_matches(".1");
        // roff: a title line naming the page, a NAME and a SYNOPSIS.
        assert!(
            text.lines()
                .any(|l| l.starts_with(".TH ") && l.contains(title)),
            "{name}: no .TH naming {title}"
        );
        assert!(
            text.contains(".SH NAME") && text.contains(".SH SYNOPSIS"),
            "{name}"
        );
        // A page of a command with subcommands lists them.
        // roff writes a hyphen as `\-`: fastpath\-lb\-hash\-eval(1).
        for sub in subcommands(path) {
            let entry = format!("{title}-{sub}(1)").replace('-', "\\-");
            assert!(text.contains(&entry), "{name} does not list {entry}");
        }
    }
    // man(1) itself renders one, where man is installed.
    if let Ok(out) = Command::new("man")
        .arg("-l")
        .arg(dir.join("fastpath-lb-run.1"))
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
    {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("--interface"), "{text}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn completions_name_the_real_subcommands() {
    let commands = all_commands();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = run(fastpath().args(["completions", shell]));
        for path in commands.iter().filter(|p| !p.is_empty()) {
            let last = path.last().unwrap();
            assert!(script.contains(last.as_str()), "{shell}: no {last}");
        }
    }
    // Bash: the script parses, and completing really offers the
    // subcommands (and a subcommand's options).
    let script = run(fastpath().args(["completions", "bash"]));
    let file =
        std::env::temp_dir().join(format!("fastpath-completion-{}.bash", std::process::id()));
    std::fs::write(&file, &script).unwrap();
    let complete = |words: &str| -> BTreeSet<String> {
        let n = words.split_whitespace().count();
        let cword = if words.ends_with(' ') { n } else { n - 1 };
        let program = format!(
            "source {}; COMP_WORDS=({words}{}); COMP_CWORD={cword}; COMP_LINE='{words}'; COMP_POINT=${{#COMP_LINE}}; _fastpath fastpath \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display(),
            if words.ends_with(' ') { " ''" } else { "" },
        );
        let out = run(Command::new("bash").args(["--norc", "-c", &program]));
        out.lines().map(str::to_string).collect()
    };
    let top = complete("fastpath ");
    let expected: BTreeSet<String> = subcommands(&[]).into_iter().collect();
    assert!(
        expected.is_subset(&top),
        "{expected:?} not all offered: {top:?}"
    );
    let lb: BTreeSet<String> = complete("fastpath lb ");
    for sub in subcommands(&["lb".to_string()]) {
        assert!(lb.contains(&sub), "lb {sub} not offered: {lb:?}");
    }
    assert!(complete("fastpath lb run --inter").contains("--interface"));
    assert!(complete("fastpath comp").contains("completions"));
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn an_unknown_shell_is_refused_with_the_choices() {
    let out = fastpath().args(["completions", "tcsh"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bash") && err.contains("zsh"), "{err}");
}
