//! The tokenizer and chat templates against llama.cpp (fixtures written by
//! `scripts/reference/tokenizer_fixtures.py`): the real SmolLM2 pack, and small byte-level
//! BPE and SentencePiece vocabularies written into packs here, under every supported
//! pre-tokenizer type. Also streaming decode and malformed tokenizer metadata.

// The fixture helpers below unwrap: a fixture that does not read should fail loudly.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value as Json;
use strata_compiler::pack::{Array, GgufWriter, Pack, Value};
use strata_runtime::chat::{self, CHATML, Message};
use strata_runtime::tokenizer::{StreamDecoder, Tokenizer};

fn fixture(name: &str) -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/tokenizer").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| u32::try_from(x.as_u64().unwrap()).unwrap()).collect()
}

fn strings(v: &Json) -> Vec<String> {
    v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_owned()).collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A pack holding only tokenizer keys, in memory.
fn pack(keys: Vec<(&str, Value)>) -> Pack {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()));
    for (k, v) in keys {
        w.kv(k, v);
    }
    Pack::from_bytes("test.gguf", w.to_bytes(|_: usize, _: &mut [u8]| {})).unwrap()
}

/// The pack the reference script wrote for one variant of a small vocabulary.
fn small_pack(vocab: &Json, model: &str, keys: &Json) -> Pack {
    let mut kv = vec![
        ("tokenizer.ggml.model", Value::String(model.into())),
        ("tokenizer.ggml.tokens", Value::Array(Array::String(strings(&vocab["tokens"])))),
        (
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(
                vocab["token_type"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect(),
            )),
        ),
    ];
    if let Some(scores) = vocab.get("scores") {
        let scores = scores.as_array().unwrap().iter().map(|s| s.as_f64().unwrap() as f32).collect();
        kv.push(("tokenizer.ggml.scores", Value::Array(Array::F32(scores))));
    }
    if let Some(merges) = vocab.get("merges") {
        kv.push(("tokenizer.ggml.merges", Value::Array(Array::String(strings(merges)))));
    }
    for (field, key) in [
        ("bos", "tokenizer.ggml.bos_token_id"),
        ("eos", "tokenizer.ggml.eos_token_id"),
        ("unk", "tokenizer.ggml.unknown_token_id"),
    ] {
        if let Some(id) = vocab[field].as_u64() {
            kv.push((key, Value::U32(id as u32)));
        }
    }
    for (k, v) in keys.as_object().unwrap() {
        let value = match v {
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => Value::U32(n.as_u64().unwrap() as u32),
            Json::String(s) => Value::String(s.clone()),
            other => panic!("{k}: {other}"),
        };
        kv.push((k.as_str(), value));
    }
    pack(kv)
}

fn eog_set(tok: &Tokenizer) -> BTreeSet<u32> {
    (0..tok.vocab_size() as u32).filter(|&id| tok.is_eog(id)).collect()
}

#[test]
fn smollm2_ids_pieces_and_eog_match_llama_cpp() {
    let Some(path) = strata_tests::smollm2() else { return };
    let fx = fixture("smollm2.json");
    let tok = Tokenizer::from_pack(&Pack::open(&path).unwrap()).unwrap();
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.bos().map(u64::from), fx["bos"].as_u64());
    assert_eq!(tok.eos().map(u64::from), fx["eos"].as_u64());
    assert_eq!(eog_set(&tok), ids(&fx["eog"]).into_iter().collect());

    let mut failures = Vec::new();
    let mut checked = 0;
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        for (field, special) in [("ids", true), ("ids_nospecial", false)] {
            if case.get(field).is_none() {
                continue;
            }
            checked += 1;
            let (want, got) = (ids(&case[field]), tok.encode(text, special));
            if want != got {
                failures.push(format!("{text:?} special={special}: llama.cpp {want:?}, ours {got:?}"));
            }
        }
    }
    for (id, bytes) in fx["pieces"].as_object().unwrap() {
        checked += 1;
        let id: u32 = id.parse().unwrap();
        if tok.token_bytes(id) != hex(bytes.as_str().unwrap()) {
            failures.push(format!(
                "piece of {id} ({:?}): {:?}, ours {:?}",
                tok.token_text(id),
                bytes,
                tok.token_bytes(id)
            ));
        }
    }
    for d in fx["detokenize"].as_array().unwrap() {
        checked += 1;
        let (list, want) = (ids(&d["ids"]), hex(d["bytes"].as_str().unwrap()));
        let ours: Vec<u8> = list.iter().flat_map(|&id| tok.token_bytes(id)).collect();
        if ours != want || tok.decode(&list) != String::from_utf8_lossy(&want) {
            failures.push(format!("detokenize {list:?}: {want:?}, ours {ours:?}"));
        }
    }
    assert!(failures.is_empty(), "{} of {checked} checks differ:\n{}", failures.len(), failures.join("\n"));
    eprintln!("smollm2: {checked} checks match llama.cpp");
}

#[test]
fn smollm2_chat_template_matches_jinja2() {
    let Some(path) = strata_tests::smollm2() else { return };
    let fx = fixture("smollm2.json");
    let tok = Tokenizer::from_pack(&Pack::open(&path).unwrap()).unwrap();
    let template = tok.chat_template().expect("SmolLM2 has a chat template");
    let (bos, eos) = (tok.token_text(tok.bos().unwrap()), tok.token_text(tok.eos().unwrap()));
    for (n, chat) in fx["chat"].as_array().unwrap().iter().enumerate() {
        let messages: Vec<Message> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let generation = chat["add_generation_prompt"].as_bool().unwrap();
        let want = chat["text"].as_str().unwrap();
        assert_eq!(chat::render(template, &messages, generation, bos, eos).unwrap(), want, "chat {n}");
        if n == 0 {
            // With a system message SmolLM2's template is plain ChatML.
            assert_eq!(chat::render(CHATML, &messages, generation, bos, eos).unwrap(), want);
        }
    }
    // The rendered prompt's special tokens come back as single tokens.
    let prompt = fx["chat"][0]["text"].as_str().unwrap();
    let ids = tok.encode(prompt, true);
    assert_eq!(ids[0], 1, "<|im_start|>");
    assert_eq!(tok.decode(&ids), prompt.replace("<|im_start|>", "").replace("<|im_end|>", ""));
}

/// Every variant of a small vocabulary: one pack each, all texts, with and without
/// special-token parsing where it matters.
fn check_small(name: &str, model: &str) -> usize {
    let fx = fixture(name);
    let texts = strings(&fx["texts"]);
    let mut failures = Vec::new();
    let mut checked = 0;
    for variant in fx["variants"].as_array().unwrap() {
        let keys = &variant["keys"];
        let tok = Tokenizer::from_pack(&small_pack(&fx, model, keys)).unwrap();
        let label = keys.to_string();
        checked += 1;
        if eog_set(&tok) != ids(&variant["eog"]).into_iter().collect() {
            failures.push(format!("{label}: EOG {:?}, ours {:?}", variant["eog"], eog_set(&tok)));
        }
        assert_eq!(tok.bos().map(i64::from).unwrap_or(-1), variant["bos"].as_i64().unwrap(), "{label}");
        for (i, text) in texts.iter().enumerate() {
            for (field, special) in [("ids", true), ("ids_nospecial", false)] {
                let want = &variant[field][i];
                if want.is_null() {
                    continue;
                }
                checked += 1;
                let (want, got) = (ids(want), tok.encode(text, special));
                if want != got {
                    failures.push(format!(
                        "{label} {text:?} special={special}:\n  llama.cpp {want:?}\n  ours      {got:?}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{name}: {} of {checked} checks differ:\n{}", failures.len(), failures.join("\n"));
    checked
}

#[test]
fn byte_level_bpe_matches_llama_cpp_for_every_pre_tokenizer() {
    let n = check_small("bpe_small.json", "gpt2");
    eprintln!("bpe_small: {n} checks match llama.cpp");
}

#[test]
fn sentencepiece_matches_llama_cpp() {
    let n = check_small("spm_small.json", "llama");
    eprintln!("spm_small: {n} checks match llama.cpp");
}

#[test]
fn an_unknown_pre_tokenizer_is_refused_by_name() {
    let fx = fixture("bpe_small.json");
    let keys = serde_json::json!({ "tokenizer.ggml.pre": "no-such-pre" });
    let err = Tokenizer::from_pack(&small_pack(&fx, "gpt2", &keys)).expect_err("refused").to_string();
    assert_eq!(
        err,
        "tokenizer: key tokenizer.ggml.pre: pre-tokenizer \"no-such-pre\" is not supported (README: supported models)"
    );
    // One of the names llama.cpp gives GPT-2's pattern tokenizes as "gpt-2" does.
    let gpt2 = &fx["variants"].as_array().unwrap().iter().find(|v| v["keys"]["tokenizer.ggml.pre"] == "gpt-2").unwrap();
    let tok =
        Tokenizer::from_pack(&small_pack(&fx, "gpt2", &serde_json::json!({ "tokenizer.ggml.pre": "olmo" }))).unwrap();
    for (i, text) in strings(&fx["texts"]).iter().enumerate() {
        assert_eq!(tok.encode(text, true), ids(&gpt2["ids"][i]), "{text:?}");
    }
}

#[test]
fn stream_decoder_holds_back_split_characters() {
    // SentencePiece byte fallback: a 4-byte character is four tokens.
    let fx = fixture("spm_small.json");
    let keys = serde_json::json!({ "general.name": "x", "tokenizer.ggml.add_bos_token": false });
    let tok = Tokenizer::from_pack(&small_pack(&fx, "llama", &keys)).unwrap();
    let text = " a🦙b日本";
    let ids = tok.encode("a🦙b日本", false);
    assert!(ids.len() >= 9, "{ids:?}");
    let mut dec = StreamDecoder::new();
    let pieces: Vec<String> = ids.iter().map(|&id| dec.push(&tok, id)).collect();
    assert_eq!(pieces.concat() + &dec.finish(), text);
    assert!(pieces.iter().filter(|p| p.is_empty()).count() >= 3 + 2 + 2, "{pieces:?}");
    assert!(pieces.contains(&"🦙".to_owned()), "{pieces:?}");

    // Bytes that can never be UTF-8 come out replaced at once; an unfinished sequence at
    // the end comes out replaced by finish().
    let keys = serde_json::json!({
        "general.name": "x", "tokenizer.ggml.add_bos_token": false, "tokenizer.ggml.add_space_prefix": false
    });
    let tok = Tokenizer::from_pack(&small_pack(&fx, "llama", &keys)).unwrap();
    let ef = tok.encode("\u{FFFF}", false)[0];
    assert_eq!(tok.token_text(ef), "<0xEF>");
    let x = tok.encode("x", false);
    assert_eq!(x.len(), 1);
    let mut dec = StreamDecoder::new();
    assert_eq!(dec.push(&tok, ef), "");
    assert_eq!(dec.push(&tok, x[0]), "\u{FFFD}x");
    assert_eq!(dec.push(&tok, ef), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
    assert_eq!(dec.finish(), "");

    // Byte-level BPE: a character split over tokens of a small vocabulary.
    let fx = fixture("bpe_small.json");
    let keys = serde_json::json!({ "tokenizer.ggml.pre": "qwen2" });
    let tok = Tokenizer::from_pack(&small_pack(&fx, "gpt2", &keys)).unwrap();
    let text = "emoji 🦙🚀 日本語 é";
    let ids = tok.encode(text, true);
    let mut dec = StreamDecoder::new();
    let pieces: Vec<String> = ids.iter().map(|&id| dec.push(&tok, id)).collect();
    assert!(pieces.iter().any(String::is_empty), "{pieces:?}");
    assert_eq!(pieces.concat() + &dec.finish(), text);
    assert_eq!(tok.decode(&ids), text);
}

#[test]
fn token_bytes_of_special_and_out_of_range_tokens() {
    let fx = fixture("spm_small.json");
    let keys = serde_json::json!({ "general.name": "x" });
    let tok = Tokenizer::from_pack(&small_pack(&fx, "llama", &keys)).unwrap();
    let bos = tok.bos().unwrap();
    assert_eq!(tok.token_text(bos), "<s>");
    assert!(tok.token_bytes(bos).is_empty(), "control tokens are never printed");
    let hello = tok.encode("hello world", false);
    assert_eq!(hello[0], bos);
    assert_eq!(tok.decode(&hello), " hello world");
    let n = tok.vocab_size() as u32;
    assert!(tok.token_bytes(n).is_empty());
    assert_eq!(tok.token_text(n + 5), "");
    assert!(!tok.is_eog(n));
    assert_eq!(tok.decode(&[n, u32::MAX]), "");
}

/// The keys of a minimal valid byte-level pack: bytes "a", "b", merged "ab".
fn tiny_bpe() -> Vec<(&'static str, Value)> {
    vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        (
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec!["a".into(), "b".into(), "ab".into(), "<|x|>".into()])),
        ),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1, 1, 1, 3]))),
        ("tokenizer.ggml.merges", Value::Array(Array::String(vec!["a b".into()]))),
    ]
}

fn with(mut keys: Vec<(&'static str, Value)>, key: &'static str, value: Option<Value>) -> Vec<(&'static str, Value)> {
    keys.retain(|(k, _)| *k != key);
    if let Some(v) = value {
        keys.push((key, v));
    }
    keys
}

#[test]
fn tiny_vocabulary_and_defaults() {
    let tok = Tokenizer::from_pack(&pack(tiny_bpe())).unwrap();
    assert_eq!(tok.encode("abba", true), vec![2, 1, 0]);
    assert_eq!(tok.encode("ab<|x|>b", true), vec![2, 3, 1]);
    // Characters outside the vocabulary are dropped, as llama.cpp drops them.
    assert_eq!(tok.encode("a c", false), vec![0]);
    // llama.cpp's defaults for a byte-level pack without ids: BOS = EOS = 11, here
    // outside the vocabulary, so none; no BOS added.
    assert_eq!((tok.bos(), tok.eos()), (None, None));
    assert_eq!(tok.chat_template(), None);
    let keys = with(tiny_bpe(), "tokenizer.ggml.bos_token_id", Some(Value::U32(3)));
    let keys = with(keys, "tokenizer.ggml.add_bos_token", Some(Value::Bool(true)));
    let keys = with(keys, "tokenizer.ggml.eos_token_id", Some(Value::U32(99)));
    let tok = Tokenizer::from_pack(&pack(keys)).unwrap();
    assert_eq!(tok.encode("ab", false), vec![3, 2]);
    assert_eq!(tok.eos(), None, "an id past the vocabulary is ignored, as llama.cpp does");
}

#[test]
fn bad_metadata_is_an_error_naming_the_key() {
    let cases: Vec<(Vec<(&str, Value)>, &str)> = vec![
        (with(tiny_bpe(), "tokenizer.ggml.tokens", None), "tokenizer.ggml.tokens"),
        (with(tiny_bpe(), "tokenizer.ggml.model", None), "tokenizer.ggml.model"),
        (with(tiny_bpe(), "tokenizer.ggml.model", Some(Value::String("bert".into()))), "tokenizer.ggml.model"),
        (with(tiny_bpe(), "tokenizer.ggml.model", Some(Value::U32(2))), "tokenizer.ggml.model"),
        (
            with(tiny_bpe(), "tokenizer.ggml.tokens", Some(Value::Array(Array::I32(vec![1, 2])))),
            "tokenizer.ggml.tokens",
        ),
        (with(tiny_bpe(), "tokenizer.ggml.tokens", Some(Value::String("a".into()))), "tokenizer.ggml.tokens"),
        (with(tiny_bpe(), "tokenizer.ggml.tokens", Some(Value::Array(Array::String(vec![])))), "tokenizer.ggml.tokens"),
        (with(tiny_bpe(), "tokenizer.ggml.merges", None), "tokenizer.ggml.merges"),
        (
            with(tiny_bpe(), "tokenizer.ggml.merges", Some(Value::Array(Array::String(vec!["a c".into()])))),
            "tokenizer.ggml.merges",
        ),
        (
            with(tiny_bpe(), "tokenizer.ggml.merges", Some(Value::Array(Array::String(vec!["b a".into()])))),
            "tokenizer.ggml.merges",
        ),
        (
            with(tiny_bpe(), "tokenizer.ggml.merges", Some(Value::Array(Array::String(vec!["ab".into()])))),
            "tokenizer.ggml.merges",
        ),
        (with(tiny_bpe(), "tokenizer.ggml.merges", Some(Value::Array(Array::U8(vec![1])))), "tokenizer.ggml.merges"),
        (
            with(tiny_bpe(), "tokenizer.ggml.token_type", Some(Value::Array(Array::F32(vec![1.0; 4])))),
            "tokenizer.ggml.token_type",
        ),
        (
            with(tiny_bpe(), "tokenizer.ggml.token_type", Some(Value::Array(Array::I32(vec![1; 3])))),
            "tokenizer.ggml.token_type",
        ),
        (with(tiny_bpe(), "tokenizer.ggml.scores", Some(Value::Array(Array::F32(vec![0.0])))), "tokenizer.ggml.scores"),
        (with(tiny_bpe(), "tokenizer.ggml.scores", Some(Value::Bool(true))), "tokenizer.ggml.scores"),
        (
            with(tiny_bpe(), "tokenizer.ggml.bos_token_id", Some(Value::String("1".into()))),
            "tokenizer.ggml.bos_token_id",
        ),
        (with(tiny_bpe(), "tokenizer.ggml.eos_token_id", Some(Value::I32(-1))), "tokenizer.ggml.eos_token_id"),
        (with(tiny_bpe(), "tokenizer.ggml.add_bos_token", Some(Value::U32(1))), "tokenizer.ggml.add_bos_token"),
        (with(tiny_bpe(), "tokenizer.ggml.pre", Some(Value::U32(1))), "tokenizer.ggml.pre"),
        (with(tiny_bpe(), "tokenizer.chat_template", Some(Value::U32(1))), "tokenizer.chat_template"),
    ];
    for (keys, key) in cases {
        let err = Tokenizer::from_pack(&pack(keys)).expect_err(key).to_string();
        assert!(err.contains(key) && !err.contains('\n'), "{key}: {err}");
    }
}

#[test]
fn sentencepiece_without_byte_tokens_does_not_panic() {
    let keys = vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(["<unk>", "<s>", "</s>", "▁a", "b"].map(String::from).to_vec())),
        ),
        ("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0, 0.0, 0.0, -1.0, -2.0]))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![2, 3, 3, 1, 1]))),
    ];
    let tok = Tokenizer::from_pack(&pack(keys)).unwrap();
    // llama.cpp's SentencePiece defaults: BOS 1 added, EOS 2, unknown 0, space prefix.
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    assert!(tok.is_eog(2));
    // No "<0xNN>" tokens: the bytes of "▁" and "ü" become <unk> (llama.cpp would abort).
    assert_eq!(tok.encode("ab ü", false), vec![1, 3, 4, 0, 0, 0, 0, 0]);
    assert_eq!(tok.decode(&[1, 3, 4]), " ab");
}

#[test]
fn tokenizer_can_be_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizer>();
    shared::<StreamDecoder>();
}
