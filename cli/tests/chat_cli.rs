//! `strata-run chat` in a pseudo-terminal (util-linux `script`), on the CPU with the
//! default model: later turns read only their new tokens, /clear starts over, /exit
//! quits, Ctrl-C stops a reply and, at the prompt, quits.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `strata-run chat ARGS` on a pseudo-terminal; None where `script` is missing.
struct Chat {
    child: Child,
    stdin: ChildStdin,
    output: Receiver<Vec<u8>>,
    seen: String,
}

impl Chat {
    fn start(args: &[&str]) -> Option<Chat> {
        let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
        let cmd = std::iter::once(env!("CARGO_BIN_EXE_strata-run")).chain(args.iter().copied());
        let cmd: Vec<String> = cmd.map(quote).collect();
        let mut child = match Command::new("script")
            .args(["-q", "-e", "-c", &format!("exec {}", cmd.join(" ")), "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("skipping: no `script` (util-linux) to make a pseudo-terminal: {e}");
                return None;
            }
        };
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = child.stdout.take().expect("stdout");
        let (tx, output) = channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Some(Chat { child, stdin, output, seen: String::new() })
    }

    /// Waits for `count` occurrences of `what` in everything seen so far; the text.
    fn wait_for(&mut self, what: &str, count: usize) -> String {
        self.wait_until(&format!("{what:?} (x{count})"), |seen| seen.matches(what).count() >= count)
    }

    /// Waits until `done` holds for everything seen so far; the text.
    fn wait_until(&mut self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(180);
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(b) => self.seen.push_str(&text(&b)),
                Err(_) => panic!("no {what} in:\n{}", self.seen),
            }
        }
        self.seen.clone()
    }

    fn send(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).and_then(|()| self.stdin.flush()).expect("send");
    }

    fn exit_code(mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("chat did not exit:\n{}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The usage lines `[N prompt tokens, M generated, X t/s]` seen so far, as (N, M).
fn usage(seen: &str) -> Vec<(usize, usize)> {
    seen.split('[')
        .filter_map(|s| {
            let (n, rest) = s.split_once(" prompt tokens, ")?;
            let (m, _) = rest.split_once(" generated, ")?;
            Some((n.trim().parse().ok()?, m.trim().parse().ok()?))
        })
        .collect()
}

/// Token count of `prompt` (special tokens parsed, as the chat parses its template's).
fn tokens(model: &str, prompt: &str) -> usize {
    let o = Command::new(env!("CARGO_BIN_EXE_strata-run"))
        .args(["score", "--pack", model, "--top-k", "1", "--json", "--prompt", prompt])
        .args(strata_tests::behaviour_backend())
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    v["positions"].as_array().expect("positions").len()
}

#[test]
fn chat_keeps_the_conversation_in_the_cache() {
    let Some(model) = strata_tests::smollm2() else { return };
    let model = model.to_str().expect("utf-8");
    let max = 8;
    let args =
        [&["chat", "-m", model, "--ctx", "512", "--max-tokens", "8"], strata_tests::behaviour_backend()].concat();
    let Some(mut chat) = Chat::start(&args) else { return };
    chat.wait_for("> ", 1);
    chat.send("What is the capital of France?\n");
    chat.wait_for(" t/s]", 1);
    chat.send("And of Italy?\n");
    let seen = chat.wait_for(" t/s]", 2);
    let turns = usage(&seen);
    assert_eq!(turns.len(), 2, "{seen}");
    let (first, replied) = turns[0];
    // The second turn reads the end of the reply (its last token, unless it ended at the
    // end-of-turn token), the template's markup and the new message: nothing earlier.
    let delta = "<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n";
    let unread = usize::from(replied == max);
    assert_eq!(turns[1].0, tokens(model, delta) + unread, "{seen}");
    assert!(turns[1].0 < first, "{seen}");

    // /clear: the same question reads the whole prompt again, and gets the same reply.
    chat.send("/clear\n");
    chat.wait_for("(conversation cleared)", 1);
    chat.send("What is the capital of France?\n");
    let seen = chat.wait_for(" t/s]", 3);
    assert_eq!(usage(&seen)[2], turns[0], "{seen}");
    chat.send("/exit\n");
    assert_eq!(chat.exit_code(), Some(0));

    // Ctrl-C stops a reply, once its first text is out; a second one, at the prompt, quits.
    let args =
        [&["chat", "-m", model, "--ctx", "1024", "--max-tokens", "900"], strata_tests::behaviour_backend()].concat();
    let Some(mut chat) = Chat::start(&args) else { return };
    chat.wait_for("> ", 1);
    let question = "Tell me a long story about a dragon.";
    chat.send(&format!("{question}\n"));
    chat.wait_until("the reply's first text", |seen| {
        seen.find(question).is_some_and(|at| !seen[at + question.len()..].trim_start().is_empty())
    });
    chat.send("\u{3}");
    let seen = chat.wait_for(" t/s]", 1);
    assert!(seen.contains(" (stopped)"), "{seen}");
    let (_, stopped) = usage(&seen)[0];
    assert!(stopped > 0 && stopped < 900, "{seen}");
    chat.wait_for("> ", 2);
    chat.send("\u{3}");
    assert_eq!(chat.exit_code(), Some(130));
}
