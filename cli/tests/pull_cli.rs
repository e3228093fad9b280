//! `strata-run pull` and `-m OWNER/REPO:QUANT` against a local stand-in for the Hugging
//! Face hub (`HF_ENDPOINT`): the listing API, resolve URLs with Range and the checksum
//! header, a connection cut mid-body, a bad checksum, unknown repositories and quants.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// One request the hub saw: path, Range header, Authorization header.
type Seen = Arc<Mutex<Vec<(String, Option<String>, Option<String>)>>>;

struct Hub {
    port: u16,
    seen: Seen,
}

/// Serves repository `org/tiny` with `tiny-Q8_0.gguf` (the pack; the first full GET is
/// cut halfway), `tiny-BAD.gguf` (listed with a wrong SHA-256) and a README, and
/// `org/split` with the two shards of a split pack.
fn hub(pack: Vec<u8>, shards: [Vec<u8>; 2]) -> Hub {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let pack = Arc::new(pack);
    std::thread::spawn(move || {
        let mut cut_once = true;
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let cut = serve(stream, &pack, &shards, &log, cut_once);
            cut_once &= !cut;
        }
    });
    Hub { port, seen }
}

/// Answers one request; true if it cut the connection.
fn serve(mut stream: TcpStream, pack: &[u8], shards: &[Vec<u8>; 2], log: &Seen, cut_once: bool) -> bool {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return false;
    }
    let path = line.split_whitespace().nth(1).unwrap_or_default().to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_string()),
                "authorization" => auth = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    log.lock().expect("log").push((path.clone(), range.clone(), auth));
    let good = hex(pack);
    let bad = hex(b"something else");
    let mut respond = |status: &str, headers: &[(&str, String)], body: &[u8]| {
        let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body));
    };
    if path.starts_with("/api/models/org/tiny/revision/main") {
        let sib = |name: &str, sha: &str| serde_json::json!({ "rfilename": name, "size": pack.len(), "lfs": { "sha256": sha, "size": pack.len() } });
        let body = serde_json::json!({ "id": "org/tiny", "siblings": [
            { "rfilename": "README.md", "size": 5 },
            sib("tiny-Q8_0.gguf", &good),
            sib("tiny-BAD.gguf", &bad),
        ]});
        respond("200 OK", &[("Content-Type", "application/json".into())], body.to_string().as_bytes());
        return false;
    }
    let shard_name = |i: usize| format!("tiny-Q8_0-{:05}-of-00002.gguf", i + 1);
    if path.starts_with("/api/models/org/split/revision/main") {
        let sib = |i: usize| {
            let (name, bytes) = (shard_name(i), &shards[i]);
            serde_json::json!({ "rfilename": name, "size": bytes.len(), "lfs": { "sha256": hex(bytes), "size": bytes.len() } })
        };
        let body = serde_json::json!({ "id": "org/split", "siblings": [sib(1), sib(0)] });
        respond("200 OK", &[], body.to_string().as_bytes());
        return false;
    }
    if let Some(i) = (0..2).find(|&i| path == format!("/org/split/resolve/main/{}", shard_name(i))) {
        respond("200 OK", &[("X-Linked-Etag", format!("\"{}\"", hex(&shards[i])))], &shards[i]);
        return false;
    }
    let sha = match path.as_str() {
        "/org/tiny/resolve/main/tiny-Q8_0.gguf" => good,
        "/org/tiny/resolve/main/tiny-BAD.gguf" => bad,
        _ => {
            respond("404 Not Found", &[], b"{\"error\":\"Repository not found\"}");
            return false;
        }
    };
    let headers = vec![("X-Linked-Etag", format!("\"{sha}\"")), ("X-Linked-Size", pack.len().to_string())];
    let start: usize = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if range.as_deref() == Some("bytes=0-0") {
        let mut h = headers;
        h.push(("Content-Range", format!("bytes 0-0/{}", pack.len())));
        respond("206 Partial Content", &h, &pack[..1]);
        return false;
    }
    if start == 0 && cut_once && path.ends_with("Q8_0.gguf") {
        // Promise the whole file, send half, hang up.
        let head = format!(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: {}\r\nX-Linked-Etag: \"{}\"\r\n\r\n",
            pack.len(),
            headers[0].1.trim_matches('"')
        );
        let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&pack[..pack.len() / 2]));
        let _ = stream.flush();
        let _ = stream.shutdown(std::net::Shutdown::Both);
        return true;
    }
    if start > 0 {
        let mut h = headers;
        h.push(("Content-Range", format!("bytes {start}-{}/{}", pack.len() - 1, pack.len())));
        respond("206 Partial Content", &h, &pack[start..]);
    } else {
        respond("200 OK", &headers, pack);
    }
    false
}

fn strata_run(hub: &Hub, cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata-run"))
        .args(args)
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{}", hub.port))
        .env("HF_TOKEN", "secret")
        .env("STRATA_CACHE", cache)
        .output()
        .expect("runs")
}

/// A synthetic pack's files: one, or the shards of a split one.
fn synth(dir: &Path, split: usize) -> Vec<Vec<u8>> {
    let out = dir.join(format!("tiny{split}.gguf"));
    let o = Command::new(env!("CARGO_BIN_EXE_strata-compile"))
        .args(["synth", "--preset", "tiny-llama", "--type", "Q8_0", "--seed", "9", "--split", &split.to_string()])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let read = |p: &Path| {
        let mut bytes = Vec::new();
        std::fs::File::open(p).and_then(|mut f| f.read_to_end(&mut bytes)).expect("read");
        bytes
    };
    if split <= 1 {
        return vec![read(&out)];
    }
    (1..=split).map(|i| read(&dir.join(format!("tiny{split}-{i:05}-of-{split:05}.gguf")))).collect()
}

#[test]
fn pull_downloads_resumes_verifies_and_names_what_is_missing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = synth(dir.path(), 1).remove(0);
    let [first, second]: [Vec<u8>; 2] = synth(dir.path(), 2).try_into().expect("two shards");
    let hub = hub(pack.clone(), [first.clone(), second.clone()]);
    let cache = dir.path().join("cache");

    // A cut connection is resumed with a Range request; the file is whole and verified.
    let o = strata_run(&hub, &cache, &["pull", "org/tiny:q8_0"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let path = text(&o.stdout).trim().to_string();
    assert_eq!(Path::new(&path), cache.join("models/huggingface/org/tiny/main/tiny-Q8_0.gguf"));
    assert_eq!(std::fs::read(&path).expect("downloaded"), pack);
    assert!(!Path::new(&format!("{path}.part")).exists());
    let e = text(&o.stderr);
    assert!(e.contains("resuming") && e.contains(&format!("sha256 {}", hex(&pack))), "{e}");
    {
        let seen = hub.seen.lock().expect("log");
        let gets: Vec<_> = seen.iter().filter(|(p, _, _)| p.ends_with("tiny-Q8_0.gguf")).collect();
        assert_eq!(gets.len(), 2, "{seen:?}");
        assert_eq!(gets[1].1.as_deref(), Some(format!("bytes={}-", pack.len() / 2).as_str()), "{seen:?}");
        assert!(seen.iter().all(|(_, _, auth)| auth.as_deref() == Some("Bearer secret")), "{seen:?}");
    }

    // -m runs it from the cache.
    let o = strata_run(
        &hub,
        &cache,
        &["generate", "-m", "org/tiny:Q8_0", "--backend", "cpu", "--prompt", "hi", "--max-tokens", "2"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("is in the cache"), "{}", text(&o.stderr));
    let art = dir.path().join("art");
    let o = Command::new(env!("CARGO_BIN_EXE_strata-compile"))
        .args(["-m", "org/tiny:Q8_0", "--target", "sm_90", "--emit-only", "--out"])
        .arg(&art)
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{}", hub.port))
        .env("STRATA_CACHE", &cache)
        .output()
        .expect("runs");
    assert!(o.status.success(), "strata-compile -m: {}", text(&o.stderr));

    // A file URL: the checksum comes from the resolve URL's X-Linked-Etag.
    let fresh = dir.path().join("fresh");
    let url = format!("http://127.0.0.1:{}/org/tiny/resolve/main/tiny-Q8_0.gguf", hub.port);
    let o = strata_run(&hub, &fresh, &["pull", &url]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(text(&o.stdout).trim()).expect("downloaded"), pack);

    // A checksum mismatch deletes the download.
    let o = strata_run(&hub, &cache, &["pull", "org/tiny:BAD"]);
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(e.contains("checksum mismatch for tiny-BAD.gguf") && e.contains("deleted"), "{e}");
    let bad = cache.join("models/huggingface/org/tiny/main/tiny-BAD.gguf");
    assert!(!bad.exists() && !bad.with_extension("gguf.part").exists());

    // Unknown repository, unknown quant.
    let o = strata_run(&hub, &cache, &["pull", "org/nope:Q8_0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("repository org/nope not found"), "{}", text(&o.stderr));
    let o = strata_run(&hub, &cache, &["pull", "org/tiny:Q5_K"]);
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(e.contains("org/tiny matches quantization Q5_K; its files: tiny-BAD.gguf, tiny-Q8_0.gguf"), "{e}");
    let o = strata_run(&hub, &cache, &["pull", "org/tiny"]);
    assert!(text(&o.stderr).contains("several packs"), "{}", text(&o.stderr));

    // A split pack: every shard, the first one's path printed, and it runs.
    let o = strata_run(&hub, &cache, &["pull", "org/split"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let dir = cache.join("models/huggingface/org/split/main");
    assert_eq!(Path::new(text(&o.stdout).trim()), dir.join("tiny-Q8_0-00001-of-00002.gguf"));
    assert_eq!(std::fs::read(dir.join("tiny-Q8_0-00001-of-00002.gguf")).expect("shard 1"), first);
    assert_eq!(std::fs::read(dir.join("tiny-Q8_0-00002-of-00002.gguf")).expect("shard 2"), second);
    let o = strata_run(
        &hub,
        &cache,
        &["generate", "-m", "org/split:q8_0", "--backend", "cpu", "--prompt", "hi", "--max-tokens", "2"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
}
