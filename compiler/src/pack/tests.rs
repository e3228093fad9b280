//! Reader tests: round trips through the writer, hand-made files for every
//! validation rule, and split packs on disk.

use super::*;
use crate::quant::GgmlType;

/// Hand-assembles GGUF bytes, so tests can write what the writer never would.
struct Raw {
    version: u32,
    kvs: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

impl Raw {
    fn new() -> Raw {
        Raw { version: 3, kvs: Vec::new(), n_kv: 0, infos: Vec::new(), n_tensors: 0, data: Vec::new() }
    }

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    fn kv_u32(mut self, key: &str, v: u32) -> Raw {
        Raw::string(&mut self.kvs, key);
        self.kvs.extend_from_slice(&4u32.to_le_bytes());
        self.kvs.extend_from_slice(&v.to_le_bytes());
        self.n_kv += 1;
        self
    }

    fn kv_raw(mut self, key: &str, ty: u32, value: &[u8]) -> Raw {
        Raw::string(&mut self.kvs, key);
        self.kvs.extend_from_slice(&ty.to_le_bytes());
        self.kvs.extend_from_slice(value);
        self.n_kv += 1;
        self
    }

    fn tensor(mut self, name: &str, shape: &[u64], ty: u32, offset: u64) -> Raw {
        Raw::string(&mut self.infos, name);
        self.infos.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in shape {
            self.infos.extend_from_slice(&d.to_le_bytes());
        }
        self.infos.extend_from_slice(&ty.to_le_bytes());
        self.infos.extend_from_slice(&offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    fn data(mut self, n: usize) -> Raw {
        self.data = vec![0; n];
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.n_tensors.to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kvs);
        out.extend_from_slice(&self.infos);
        out.resize(out.len().next_multiple_of(32), 0);
        out.extend_from_slice(&self.data);
        out
    }

    fn parse(&self) -> Result<GgufFile, PackErrorKind> {
        parse(&self.bytes())
    }
}

fn err(raw: &Raw) -> String {
    raw.parse().expect_err("should be refused").to_string()
}

#[test]
fn every_value_type_round_trips() {
    let values = vec![
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-100)),
        ("u16", Value::U16(60_000)),
        ("i16", Value::I16(-30_000)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-2_000_000_000)),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f32", Value::F32(1.5e-5)),
        ("f64", Value::F64(-2.25)),
        ("bool", Value::Bool(true)),
        ("string", Value::String("héllo ✓".into())),
        ("empty", Value::Array(Array::U8(vec![]))),
        ("strings", Value::Array(Array::String(vec!["a".into(), String::new(), "ü".into()]))),
        ("bools", Value::Array(Array::Bool(vec![true, false]))),
        ("f64s", Value::Array(Array::F64(vec![1.0, -0.5]))),
        ("i16s", Value::Array(Array::I16(vec![-1, 2]))),
        (
            "nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, -2, 3]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::F32(vec![0.25])]),
            ])),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.kv(k, v.clone());
    }
    w.tensor("t", GgmlType::Q4_0, &[64, 3]).expect("whole blocks");
    let bytes = w.to_bytes(|_, out| out.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8));
    let file = parse(&bytes).expect("valid");
    assert_eq!(file.version, 3);
    for (k, v) in &values {
        assert_eq!(file.metadata.get(k), Some(v), "{k}");
    }
    let t = &file.tensors[0];
    assert_eq!((t.ty, t.shape.as_slice(), t.bytes), (GgmlType::Q4_0, &[64u64, 3][..], 3 * 2 * 18));
    assert_eq!(t.offset % 32, 0);
    assert_eq!(bytes[t.offset as usize + 5], 5);
}

#[test]
fn version_2_reads_like_3() {
    let mut raw = Raw::new().kv_u32("general.alignment", 64).tensor("t", &[32], 8, 0).data(34);
    raw.version = 2;
    let bytes = raw.bytes();
    // With 64-byte alignment the data section starts at the next multiple of 64.
    let mut padded = bytes[..bytes.len() - 34].to_vec();
    padded.resize(padded.len().next_multiple_of(64), 0);
    padded.extend_from_slice(&[0; 34]);
    let file = parse(&padded).expect("v2 is valid");
    assert_eq!((file.version, file.alignment), (2, 64));
    assert_eq!(file.tensors[0].offset % 64, 0);
}

#[test]
fn header_errors_name_what_was_expected() {
    assert!(parse(b"GGML\x03\0\0\0").unwrap_err().to_string().contains("not a GGUF file"));
    let mut raw = Raw::new();
    raw.version = 1;
    assert!(err(&raw).contains("version 1 is not supported"));
    raw.version = 3u32.swap_bytes();
    assert!(err(&raw).contains("big-endian"));
    let bytes = Raw::new().bytes();
    let e = parse(&bytes[..10]).unwrap_err().to_string();
    assert!(e.contains("tensor count") && e.contains("file ends at 10"), "{e}");
}

#[test]
fn lengths_past_the_end_are_refused_before_allocating() {
    // A string claiming 2^60 bytes.
    let mut kvs = Vec::new();
    kvs.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let raw = Raw::new().kv_raw("general.name", 8, &kvs);
    let e = err(&raw);
    assert!(e.contains("general.name") && e.contains("string of 1152921504606846976 bytes"), "{e}");
    // An array claiming 2^62 u32 elements.
    let mut arr = 4u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(1u64 << 62).to_le_bytes());
    let e = err(&Raw::new().kv_raw("tokenizer.ggml.token_type", 9, &arr));
    assert!(e.contains("token_type") && e.contains("count 4611686018427387904"), "{e}");
    // Counts of entries that cannot fit.
    let mut raw = Raw::new();
    raw.n_kv = u64::MAX;
    assert!(err(&raw).contains("metadata count"));
    let mut raw = Raw::new();
    raw.n_tensors = 1 << 40;
    assert!(err(&raw).contains("tensor count"));
}

#[test]
fn bad_values_are_refused() {
    assert!(err(&Raw::new().kv_raw("k", 99, &[])).contains("key k: unknown value type id 99"));
    assert!(err(&Raw::new().kv_raw("k", 7, &[2])).contains("bool byte 2"));
    assert!(err(&Raw::new().kv_raw("k", 8, &[2, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe])).contains("not UTF-8"));
    assert!(err(&Raw::new().kv_u32("k", 1).kv_u32("k", 2)).contains("key k: appears twice"));
    assert!(err(&Raw::new().kv_u32("general.alignment", 48)).contains("power of two"));
    // Arrays nested past the limit.
    let mut deep = Vec::new();
    for _ in 0..20 {
        deep.extend_from_slice(&9u32.to_le_bytes());
        deep.extend_from_slice(&1u64.to_le_bytes());
    }
    deep.extend_from_slice(&0u32.to_le_bytes());
    deep.extend_from_slice(&0u64.to_le_bytes());
    assert!(err(&Raw::new().kv_raw("deep", 9, &deep)).contains("nested deeper"));
}

#[test]
fn tensor_table_errors_name_the_tensor() {
    let cases: Vec<(Raw, &str)> = vec![
        (Raw::new().tensor("a", &[32], 4, 0).data(64), "tensor a: unknown ggml type id 4"),
        (Raw::new().tensor("a", &[48], 2, 0).data(64), "row length 48 is not a multiple of the Q4_0 block size 32"),
        (Raw::new().tensor("a", &[32], 2, 16).data(64), "not a multiple of the alignment 32"),
        (
            Raw::new().tensor("a", &[32, 100], 2, 0).data(64),
            "the file is truncated: its tensor table needs 1896 bytes, but the file has 160",
        ),
        (Raw::new().tensor("a", &[32], 2, u64::MAX - 31).data(64), "runs past the end"),
        (Raw::new().tensor("a", &[32, 0], 2, 0).data(64), "dimension 1 is zero"),
        (Raw::new().tensor("a", &[1, 1, 1, 1, 1], 0, 0).data(64), "5 dimensions"),
        (Raw::new().tensor("a", &[1 << 32, 1 << 32], 0, 0).data(64), "too large"),
        (
            Raw::new().tensor("a", &[64], 0, 0).tensor("b", &[32], 0, 128).tensor("c", &[32], 0, 224).data(512),
            "tensor b: data at offset 256 overlaps a (offset 128, 256 bytes)",
        ),
        (Raw::new().tensor("a", &[8], 0, 0).tensor("a", &[8], 0, 32).data(64), "tensor a: appears twice"),
    ];
    for (raw, expected) in cases {
        let e = err(&raw);
        assert!(e.contains(expected), "{e:?} should contain {expected:?}");
    }
    // Overlap: a spans [0, 256), c starts at 224.
    let e = err(&Raw::new().tensor("a", &[64], 0, 0).tensor("c", &[32], 0, 224).data(512));
    assert!(e.contains("overlaps a"), "{e}");
}

#[test]
fn typed_accessors_name_the_key() {
    let file = Raw::new()
        .kv_raw("general.architecture", 4, &7u32.to_le_bytes())
        .kv_raw("neg", 5, &(-3i32).to_le_bytes())
        .parse()
        .expect("valid");
    let e = file.metadata.str("general.architecture").unwrap_err().to_string();
    assert_eq!(e, "key general.architecture: expected a string, found u32 7");
    assert!(file.metadata.u64("neg").is_err());
    assert_eq!(file.metadata.f64("neg"), Ok(Some(-3.0)));
    assert_eq!(file.metadata.u32("absent"), Ok(None));
}

fn small_pack(w: &mut GgufWriter) {
    w.kv("general.architecture", Value::String("test".into()));
    for i in 0..5 {
        w.tensor(&format!("t{i}"), GgmlType::Q8_0, &[32, (i + 1) as u64]).expect("whole blocks");
    }
}

#[test]
fn split_packs_open_as_one_from_any_shard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = GgufWriter::new();
    small_pack(&mut w);
    let fill = |i: usize, out: &mut [u8]| out.fill(i as u8 + 1);
    let paths = w.write_split(&dir.path().join("m"), 3, fill).expect("written");
    assert_eq!(paths[2].file_name().and_then(|n| n.to_str()), Some("m-00003-of-00003.gguf"));
    for p in &paths {
        let pack = Pack::open(p).expect("opens");
        assert_eq!(pack.paths().count(), 3);
        assert_eq!(pack.tensors().len(), 5);
        assert_eq!(pack.architecture().expect("set"), "test");
        for (i, t) in pack.tensors().iter().enumerate() {
            assert_eq!(t.name, format!("t{i}"));
            assert!(pack.data(t).iter().all(|&b| b == i as u8 + 1));
        }
    }
    // A missing shard is named.
    std::fs::remove_file(&paths[1]).expect("removed");
    let e = Pack::open(&paths[0]).unwrap_err().to_string();
    assert!(
        e.ends_with(
            "m-00001-of-00003.gguf: shard 2 of 3 is missing: expected m-00002-of-00003.gguf beside the first shard"
        ),
        "{e}"
    );
}

#[test]
fn split_sets_that_do_not_belong_together_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = GgufWriter::new();
    small_pack(&mut w);
    let paths = w.write_split(&dir.path().join("m"), 2, |_, _| {}).expect("written");
    // Replace shard 2 with shard 1 of another set: split.no is then wrong.
    std::fs::copy(&paths[0], &paths[1]).expect("copied");
    let e = Pack::open(&paths[0]).unwrap_err().to_string();
    assert!(
        e.ends_with("m-00002-of-00002.gguf: expected shard 2 of 2 (split.no = 1), found split.no = 0, split.count = 2"),
        "{e}"
    );
    // A split pack renamed so its shards cannot be found.
    let lone = dir.path().join("renamed.gguf");
    w.write_split(&dir.path().join("n"), 2, |_, _| {}).expect("written");
    std::fs::rename(dir.path().join("n-00001-of-00002.gguf"), &lone).expect("renamed");
    let e = Pack::open(&lone).unwrap_err().to_string();
    assert!(e.contains("key split.count") && e.contains("-00001-of-00002.gguf"), "{e}");
}

#[test]
fn io_errors_name_the_file() {
    let e = Pack::open(Path::new("/nonexistent/model.gguf")).unwrap_err().to_string();
    assert!(e.starts_with("/nonexistent/model.gguf: cannot read"), "{e}");
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").expect("written");
    let e = Pack::open(&empty).unwrap_err().to_string();
    assert!(e.contains("empty.gguf: magic: needs 4 bytes at offset 0"), "{e}");
}

/// Names read from the file print with control characters escaped: a tensor or key name
/// holding a newline cannot forge an output line.
#[test]
fn names_print_with_control_characters_escaped() {
    let e = err(&Raw::new().tensor("a\nerror: forged\u{1b}[2J", &[32], 4, 0).data(64));
    assert!(e.contains("tensor a\\nerror: forged\\u{1b}[2J: unknown ggml type id 4"), "{e:?}");
    assert!(!e.contains('\n') && !e.contains('\u{1b}'), "{e:?}");
    let kind = PackErrorKind::key("k\r\n", "bad");
    assert_eq!(kind.to_string(), "key k\\r\\n: bad");
    assert_eq!(PackErrorKind::key("日本語 'q' \"x\"", "bad").to_string(), "key 日本語 'q' \"x\": bad");
}

/// A file cut short in its data is called truncated, with both sizes, and its metadata
/// can still be read.
#[test]
fn truncated_files_are_named_and_keep_their_metadata() {
    let mut w = GgufWriter::new();
    small_pack(&mut w);
    let bytes = w.to_bytes(|_, _| {});
    let whole = parse(&bytes).expect("valid");
    let end = whole.tensors.iter().map(|t| t.offset + t.bytes).max().expect("tensors");
    let cut = &bytes[..bytes.len() - 100];
    let e = parse(cut).unwrap_err().to_string();
    assert_eq!(e, format!("the file is truncated: its tensor table needs {end} bytes, but the file has {}", cut.len()));
    let (version, metadata) = crate::pack::parse_metadata(cut).expect("the header is whole");
    assert_eq!(version, 3);
    assert_eq!(metadata.str("general.architecture"), Ok(Some("test")));
}
