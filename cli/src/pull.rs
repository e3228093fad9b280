//! Getting models: `-m/--model MODEL` and `strata-run pull MODEL`, where MODEL is a local
//! path (any shard of a split pack), a Hugging Face reference `owner/repo[:QUANT]`, or a
//! file URL `https://huggingface.co/owner/repo/resolve/REV/FILE.gguf`.
//!
//! Downloads go to `${STRATA_CACHE:-~/.cache/strata}/models/huggingface/OWNER/REPO/REV/FILE`
//! through a `.part` file that a later try resumes with an HTTP Range request, and are
//! checked against the SHA-256 the hub publishes for LFS files (the listing's `lfs.sha256`,
//! else the `X-Linked-Etag` header of the resolve URL), as `huggingface_hub` does.
//! `HF_ENDPOINT` (default <https://huggingface.co>) and `HF_TOKEN` are honoured.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// Tries per file: a connection cut mid-body is resumed from where it stopped.
const TRIES: usize = 5;

/// What MODEL names.
#[derive(Debug, PartialEq, Eq)]
enum Reference {
    /// A file on this machine.
    Local(PathBuf),
    /// `owner/repo[:QUANT]` at revision main.
    Repo { repo: String, quant: Option<String> },
    /// One file of a repository at a revision.
    File { repo: String, rev: String, file: String },
}

fn parse(model: &str) -> Result<Reference> {
    let path = Path::new(model);
    if path.exists() {
        return Ok(Reference::Local(path.to_path_buf()));
    }
    if let Some(rest) = model.strip_prefix("https://").or_else(|| model.strip_prefix("http://")) {
        // HOST/owner/repo/resolve/REV/FILE
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() >= 6 && parts[3] == "resolve" && parts.last().is_some_and(|f| !f.is_empty()) {
            let file = parts[5..].join("/");
            let file = file.split(['?', '#']).next().unwrap_or_default().to_string();
            return Ok(Reference::File { repo: format!("{}/{}", parts[1], parts[2]), rev: parts[4].into(), file });
        }
        bail!("{model}: not a Hugging Face file URL (https://huggingface.co/OWNER/REPO/resolve/REVISION/FILE.gguf)");
    }
    let (repo, quant) = match model.split_once(':') {
        Some((r, q)) => (r, Some(q.to_string()).filter(|q| !q.is_empty())),
        None => (model, None),
    };
    let mut names = repo.split('/');
    let valid = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    match (names.next(), names.next(), names.next()) {
        (Some(o), Some(r), None) if valid(o) && valid(r) && !model.ends_with(".gguf") => {
            Ok(Reference::Repo { repo: repo.to_string(), quant })
        }
        _ => bail!("{model}: no such file, and not a Hugging Face reference (OWNER/REPO[:QUANT] or a file URL)"),
    }
}

/// The hub: its address, the token and where downloads are kept.
struct Hub {
    endpoint: String,
    token: Option<String>,
    cache: PathBuf,
    agent: ureq::Agent,
    /// No redirects: the checksum headers are on the hub's own answer, not the CDN's.
    head_agent: ureq::Agent,
}

impl Hub {
    fn from_env() -> Result<Hub> {
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| "https://huggingface.co".into())
            .trim_end_matches('/')
            .to_string();
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
        let base = match std::env::var_os("STRATA_CACHE") {
            Some(c) => PathBuf::from(c),
            None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set: set STRATA_CACHE")?)
                .join(".cache/strata"),
        };
        let agent = |redirects: u32| -> ureq::Agent {
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(redirects)
                .max_redirects_will_error(false)
                .timeout_connect(Some(Duration::from_secs(30)))
                .timeout_recv_response(Some(Duration::from_secs(60)))
                .timeout_recv_body(None)
                .timeout_per_read(Some(Duration::from_secs(60)))
                .user_agent(concat!("strata/", env!("CARGO_PKG_VERSION")))
                .build()
                .into()
        };
        Ok(Hub { endpoint, token, cache: base.join("models/huggingface"), agent: agent(10), head_agent: agent(0) })
    }

    fn get(&self, agent: &ureq::Agent, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let r = agent.get(url);
        match &self.token {
            Some(t) => r.header("Authorization", format!("Bearer {t}")),
            None => r,
        }
    }

    fn resolve_url(&self, repo: &str, rev: &str, file: &str) -> String {
        format!("{}/{repo}/resolve/{rev}/{file}", self.endpoint)
    }

    /// The repository's files at `rev`, with their LFS checksums where the hub has them.
    fn list(&self, repo: &str, rev: &str) -> Result<Vec<Remote>> {
        let url = format!("{}/api/models/{repo}/revision/{rev}?blobs=true", self.endpoint);
        let mut resp = self.get(&self.agent, &url).call().with_context(|| format!("asking {url}"))?;
        match resp.status().as_u16() {
            200 => {}
            401 | 404 => bail!(
                "Hugging Face repository {repo} not found at {}{}",
                self.endpoint,
                if self.token.is_none() { " (a private or gated one needs HF_TOKEN)" } else { "" }
            ),
            403 => bail!("Hugging Face repository {repo}: access refused (gated: accept its terms, and set HF_TOKEN)"),
            s => bail!("{url}: HTTP {s}"),
        }
        let body = resp.body_mut().read_to_string().with_context(|| format!("reading {url}"))?;
        let info: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("{url}: unreadable listing"))?;
        let siblings = info["siblings"].as_array().with_context(|| format!("{url}: no file list in the answer"))?;
        Ok(siblings
            .iter()
            .filter_map(|s| {
                Some(Remote {
                    repo: repo.into(),
                    rev: rev.into(),
                    file: s["rfilename"].as_str()?.to_string(),
                    sha256: s["lfs"]["sha256"].as_str().map(str::to_lowercase),
                    size: s["lfs"]["size"].as_u64().or_else(|| s["size"].as_u64()),
                })
            })
            .collect())
    }

    /// One file's checksum and size from the resolve URL's headers.
    fn head(&self, repo: &str, rev: &str, file: &str) -> Result<Remote> {
        let url = self.resolve_url(repo, rev, file);
        let resp = self
            .get(&self.head_agent, &url)
            .header("Range", "bytes=0-0")
            .call()
            .with_context(|| format!("asking {url}"))?;
        let status = resp.status().as_u16();
        if status == 401 || status == 404 {
            bail!("{url}: not found on the hub (HTTP {status}): check the repository, revision and file name");
        }
        if status >= 400 {
            bail!("{url}: HTTP {status}");
        }
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let sha256 = header("x-linked-etag")
            .map(|e| e.trim_start_matches("W/").trim_matches('"').to_lowercase())
            .filter(|e| e.len() == 64 && e.bytes().all(|b| b.is_ascii_hexdigit()));
        let size = header("x-linked-size").and_then(|s| s.parse().ok());
        Ok(Remote { repo: repo.into(), rev: rev.into(), file: file.into(), sha256, size })
    }

    fn local(&self, r: &Remote) -> PathBuf {
        self.cache.join(&r.repo).join(&r.rev).join(&r.file)
    }

    /// Downloads `r` unless it is already in the cache; returns its path.
    fn fetch(&self, r: &Remote) -> Result<PathBuf> {
        let dest = self.local(r);
        if dest.exists() {
            eprintln!("strata-run: {} is in the cache: {}", r.file, dest.display());
            return Ok(dest);
        }
        let dir = dest.parent().context("a cache path has a folder")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let part = PathBuf::from(format!("{}.part", dest.display()));
        let url = self.resolve_url(&r.repo, &r.rev, &r.file);
        let bar = ProgressBar::new(r.size.unwrap_or(0)).with_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(r.file.clone());
        let mut last_err = None;
        for attempt in 0..TRIES {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(500 << attempt.min(4)));
            }
            match self.download(&url, &part, r.size, &bar) {
                Ok(true) => {
                    last_err = None;
                    break;
                }
                Ok(false) => last_err = Some(anyhow::anyhow!("the connection ended before the end of the file")),
                Err(e) => last_err = Some(e),
            }
            if let Some(e) = &last_err {
                bar.suspend(|| eprintln!("strata-run: {}: {e:#}; resuming", r.file));
            }
        }
        bar.finish_and_clear();
        if let Some(e) = last_err {
            return Err(e.context(format!("downloading {url} (the part kept is resumed next time)")));
        }
        let got = sha256_file(&part)?;
        match &r.sha256 {
            Some(want) if *want != got => {
                let _ = std::fs::remove_file(&part);
                bail!(
                    "checksum mismatch for {} from {url}: the hub publishes sha256 {want}, the download has {got}; the download is deleted",
                    r.file
                );
            }
            Some(_) => {}
            None => eprintln!("strata-run: {}: the hub publishes no SHA-256 for it; not verified", r.file),
        }
        std::fs::rename(&part, &dest).with_context(|| format!("moving the download to {}", dest.display()))?;
        eprintln!("strata-run: {} downloaded (sha256 {got}): {}", r.file, dest.display());
        Ok(dest)
    }

    /// One try: appends to `part` from its length on. True when the file is complete.
    fn download(&self, url: &str, part: &Path, size: Option<u64>, bar: &ProgressBar) -> Result<bool> {
        let have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
        if size.is_some_and(|s| have == s) {
            return Ok(true);
        }
        let mut req = self.get(&self.agent, url);
        if have > 0 {
            req = req.header("Range", format!("bytes={have}-"));
        }
        let resp = req.call().with_context(|| format!("requesting {url}"))?;
        let status = resp.status().as_u16();
        let mut file = match status {
            206 if have > 0 => OpenOptions::new().append(true).open(part)?,
            200 => File::create(part)?,
            // The part holds more than the file: start over.
            416 => {
                std::fs::remove_file(part)?;
                bail!("{url}: the partial download does not fit the file (HTTP 416); starting over");
            }
            401 | 404 => bail!("{url}: not found on the hub (HTTP {status})"),
            s => bail!("{url}: HTTP {s}"),
        };
        let start = if status == 206 { have } else { 0 };
        let total = size.or_else(|| resp.body().content_length().map(|l| l + start));
        if let Some(t) = total {
            bar.set_length(t);
        }
        bar.set_position(start);
        let mut reader = resp.into_body().into_reader();
        let mut buf = vec![0u8; 1 << 16];
        let mut at = start;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    file.flush()?;
                    return Err(e).context("reading the download");
                }
            };
            file.write_all(&buf[..n]).with_context(|| format!("writing {}", part.display()))?;
            at += n as u64;
            bar.set_position(at);
        }
        file.flush()?;
        Ok(total.is_none_or(|t| at >= t))
    }
}

/// A file on the hub.
#[derive(Clone, Debug)]
struct Remote {
    repo: String,
    rev: String,
    file: String,
    sha256: Option<String>,
    size: Option<u64>,
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// `NAME-0000k-of-0000N.gguf` → (`NAME`, k, N).
fn shard_of(file: &str) -> Option<(&str, u32, u32)> {
    let stem = file.strip_suffix(".gguf")?;
    let (rest, n) = stem.rsplit_once("-of-")?;
    let (name, k) = rest.rsplit_once('-')?;
    if k.len() != 5 || n.len() != 5 {
        return None;
    }
    Some((name, k.parse().ok()?, n.parse().ok()?))
}

/// The files of the one pack in `files` that `quant` selects (every shard of a split
/// pack, first shard first).
fn choose(repo: &str, files: &[Remote], quant: Option<&str>) -> Result<Vec<Remote>> {
    let ggufs: Vec<&Remote> = files.iter().filter(|f| f.file.to_lowercase().ends_with(".gguf")).collect();
    if ggufs.is_empty() {
        bail!("Hugging Face repository {repo} has no .gguf file");
    }
    let matching: Vec<&Remote> = match quant {
        Some(q) => ggufs.iter().copied().filter(|f| f.file.to_lowercase().contains(&q.to_lowercase())).collect(),
        None => ggufs.clone(),
    };
    // Packs: a split pack's shards count once.
    let pack_of = |f: &Remote| match shard_of(&f.file) {
        Some((name, _, n)) => format!("{name}-*-of-{n:05}.gguf"),
        None => f.file.clone(),
    };
    let mut packs: Vec<String> = matching.iter().map(|f| pack_of(f)).collect();
    packs.dedup();
    packs.sort();
    packs.dedup();
    let all: Vec<String> = {
        let mut a: Vec<String> = ggufs.iter().map(|f| pack_of(f)).collect();
        a.sort();
        a.dedup();
        a
    };
    match (packs.len(), quant) {
        (1, _) => {}
        (0, Some(q)) => {
            bail!("no .gguf file in {repo} matches quantization {q}; its files: {}", all.join(", "))
        }
        (_, Some(q)) => {
            bail!("{q} matches several packs in {repo}: {}; name one more exactly ({repo}:QUANT)", packs.join(", "))
        }
        (_, None) => bail!("{repo} has several packs: {}; choose one with {repo}:QUANT", packs.join(", ")),
    }
    let mut chosen: Vec<Remote> = matching.into_iter().cloned().collect();
    chosen.sort_by(|a, b| a.file.cmp(&b.file));
    if let Some((_, _, n)) = shard_of(&chosen[0].file)
        && chosen.len() != n as usize
    {
        bail!("{repo}: the split pack {} lists {} of its {n} shards", packs[0], chosen.len());
    }
    Ok(chosen)
}

/// The local path of MODEL, downloading it (every shard) if it is a hub reference not yet
/// in the cache.
pub fn resolve(model: &str) -> Result<PathBuf> {
    match parse(model)? {
        Reference::Local(p) => Ok(p),
        Reference::Repo { repo, quant } => {
            let hub = Hub::from_env()?;
            let files = match hub.list(&repo, "main") {
                Ok(f) => f,
                Err(e) => match cached(&hub, &repo, quant.as_deref()) {
                    Some(p) => {
                        eprintln!("strata-run: {e:#}; using the cached {}", p.display());
                        return Ok(p);
                    }
                    None => return Err(e),
                },
            };
            let chosen = choose(&repo, &files, quant.as_deref())?;
            let mut first = None;
            for r in &chosen {
                let path = hub.fetch(r)?;
                first.get_or_insert(path);
            }
            first.context("a chosen pack has a file")
        }
        Reference::File { repo, rev, file } => {
            let hub = Hub::from_env()?;
            let r = Remote { repo, rev, file, sha256: None, size: None };
            let dest = hub.local(&r);
            if dest.exists() {
                return Ok(dest);
            }
            let r = hub.head(&r.repo, &r.rev, &r.file)?;
            hub.fetch(&r)
        }
    }
}

/// Without the hub (offline): the one cached pack of `repo` that `quant` selects.
fn cached(hub: &Hub, repo: &str, quant: Option<&str>) -> Option<PathBuf> {
    let dir = hub.cache.join(repo).join("main");
    let files: Vec<Remote> = walk(&dir)
        .into_iter()
        .filter_map(|p| {
            let file = p.strip_prefix(&dir).ok()?.to_str()?.to_string();
            Some(Remote { repo: repo.into(), rev: "main".into(), file, sha256: None, size: None })
        })
        .collect();
    let chosen = choose(repo, &files, quant).ok()?;
    Some(hub.local(chosen.first()?))
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        assert_eq!(
            parse("bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M").unwrap(),
            Reference::Repo { repo: "bartowski/SmolLM2-135M-Instruct-GGUF".into(), quant: Some("Q4_K_M".into()) }
        );
        assert_eq!(parse("a/b").unwrap(), Reference::Repo { repo: "a/b".into(), quant: None });
        assert_eq!(
            parse("https://huggingface.co/a/b/resolve/main/sub/x-Q8_0.gguf?download=true").unwrap(),
            Reference::File { repo: "a/b".into(), rev: "main".into(), file: "sub/x-Q8_0.gguf".into() }
        );
        assert!(parse("missing.gguf").unwrap_err().to_string().contains("no such file"));
        assert!(parse("dir/missing.gguf").is_err());
        assert_eq!(shard_of("m-Q4-00002-of-00003.gguf"), Some(("m-Q4", 2, 3)));
        assert_eq!(shard_of("m-Q4.gguf"), None);
    }

    #[test]
    fn a_quant_picks_one_pack() {
        let r = |f: &str| Remote { repo: "o/r".into(), rev: "main".into(), file: f.into(), sha256: None, size: None };
        let files = [
            r("m-Q4_K_M.gguf"),
            r("m-Q4_K_S.gguf"),
            r("m-Q8_0-00002-of-00002.gguf"),
            r("m-Q8_0-00001-of-00002.gguf"),
            r("README.md"),
        ];
        let names = |v: Vec<Remote>| v.into_iter().map(|r| r.file).collect::<Vec<_>>();
        assert_eq!(names(choose("o/r", &files, Some("q4_k_m")).unwrap()), ["m-Q4_K_M.gguf"]);
        assert_eq!(
            names(choose("o/r", &files, Some("Q8_0")).unwrap()),
            ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"]
        );
        let e = choose("o/r", &files, Some("Q4_K")).unwrap_err().to_string();
        assert!(e.contains("several") && e.contains("m-Q4_K_M.gguf") && e.contains("m-Q4_K_S.gguf"), "{e}");
        let e = choose("o/r", &files, Some("IQ2")).unwrap_err().to_string();
        assert!(e.contains("IQ2") && e.contains("m-Q8_0-*-of-00002.gguf"), "{e}");
    }
}
