//! The agent API (tool calls, structured output) through real clients over a real socket:
//! the scripts in `tests/openai_clients/` drive `strata-run serve` with the official
//! `openai` Python client and LangChain's OpenAI adapter (`langchain-openai`), check what
//! comes back (tool calls whose arguments validate against the tool's JSON schema, streamed
//! and not; json_schema replies that validate; a reasoning model's `reasoning_content`)
//! with `jsonschema`, and print one line. The
//! clients live in the venv `scripts/python-clients.sh` makes (scripts/setup.sh runs it):
//! without it the tests skip, or fail when `STRATA_REQUIRE` is set.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod serve_harness;

use serve_harness::{Server, THINKING_TEMPLATE};

/// A Qwen2.5-style chat template with tools (Hermes format): ChatML turns; given `tools`,
/// a system block lists them in `<tools></tools>` and asks for `<tool_call>` blocks; an
/// assistant's `tool_calls` are written back as such blocks, `tool` messages as
/// `<tool_response>` blocks in a user turn.
const TOOLS_TEMPLATE: &str = r#"
{%- if tools is defined and tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- '<|im_start|>system\n' + message.content + '<|im_end|>\n' }}
        {%- endif %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.function.name + '", "arguments": ' }}
            {{- tool_call.function.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

/// The longest one script may run: each of its requests is bounded (120 s) on its own.
const SCRIPT_LIMIT: Duration = Duration::from_secs(900);

/// The python of the clients' venv (`${STRATA_CACHE:-~/.cache/strata}/clients-venv`, made
/// by scripts/python-clients.sh) if it imports the clients; `None` skips the test, and
/// with `STRATA_REQUIRE` set (scripts/test.sh, CI) its absence fails it.
fn clients_python() -> Option<PathBuf> {
    let cache = std::env::var_os("STRATA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/strata"));
    let python = cache.join("clients-venv/bin/python");
    let imports = python.exists()
        && Command::new(&python)
            .args(["-c", "import openai, langchain_openai, jsonschema"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if imports {
        return Some(python);
    }
    assert!(
        std::env::var_os("STRATA_REQUIRE").is_none(),
        "{} cannot import openai, langchain_openai and jsonschema: run scripts/setup.sh (or scripts/python-clients.sh)",
        python.display()
    );
    eprintln!("skipping: no Python clients at {} (run scripts/python-clients.sh)", python.display());
    None
}

/// Runs `tests/openai_clients/SCRIPT` with `python` against `server`; panics with its
/// output unless it succeeds within [`SCRIPT_LIMIT`]. Returns its summary line.
fn run_script(python: &Path, script: &str, server: &Server) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_clients").join(script);
    let base = format!("http://127.0.0.1:{}/v1", server.port);
    let mut cmd = Command::new(python);
    cmd.arg(&path).arg(&base);
    // Only the arguments the scripts pass count: no client settings, tracing or proxy
    // from the environment.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if ["OPENAI_", "LANGCHAIN_", "LANGSMITH_"].iter().any(|p| key.starts_with(p)) {
            cmd.env_remove(&*key);
        }
    }
    cmd.env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{} does not start: {e}", python.display()));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits") {
            break Some(status);
        }
        if start.elapsed() > SCRIPT_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (stdout.join().expect("stdout"), stderr.join().expect("stderr"));
    match status {
        Some(s) if s.success() => {
            eprintln!("{}", out.trim());
            out.trim().to_owned()
        }
        Some(s) => panic!("{script} failed ({s}) against {base}:\n{err}{out}"),
        None => panic!("{script} ran past {SCRIPT_LIMIT:?} against {base}; killed:\n{err}{out}"),
    }
}

/// A tiny pack (random weights) with [`TOOLS_TEMPLATE`], served on one slot with room for
/// the tool definitions in the prompt.
fn tools_server(dir: &Path) -> Option<Server> {
    let pack = strata_tests::pack_with_template(&dir.join("tools.gguf"), TOOLS_TEMPLATE)?;
    Server::start_pack(&pack, &["--parallel", "1", "--ctx", "1024"], "ready")
}

#[test]
fn openai_client_tool_loop_streamed_or_not_with_tool_choice_required_or_named() {
    let Some(python) = clients_python() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(server) = tools_server(dir.path()) else { return };
    let summary = run_script(&python, "openai_tools.py", &server);
    assert!(summary.starts_with("openai_tools: ok: 4 tool loops"), "{summary}");
}

#[test]
fn langchain_chat_openai_binds_tools_and_takes_a_tool_message_back() {
    let Some(python) = clients_python() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(server) = tools_server(dir.path()) else { return };
    let summary = run_script(&python, "langchain_tools.py", &server);
    assert!(summary.starts_with("langchain_tools: ok:"), "{summary}");
}

#[test]
fn openai_client_reads_reasoning_content_streamed_or_not() {
    let Some(python) = clients_python() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pack) = strata_tests::pack_with_template(&dir.path().join("thinking.gguf"), THINKING_TEMPLATE) else {
        return;
    };
    let Some(server) = Server::start_pack(&pack, &["--parallel", "1"], "ready") else { return };
    let summary = run_script(&python, "openai_reasoning.py", &server);
    assert!(summary.starts_with("openai_reasoning: ok:"), "{summary}");
}

#[test]
fn openai_client_json_schema_replies_validate_and_json_object_parses() {
    let Some(python) = clients_python() else { return };
    let Some(server) = Server::start(&["--parallel", "1", "--ctx", "1024"], &[], "ready") else { return };
    let summary = run_script(&python, "openai_response_format.py", &server);
    assert!(summary.starts_with("openai_response_format: ok: 20 json_schema replies"), "{summary}");
}
