//! The inspect report of a fixed synthetic pack, as a reviewed snapshot: any change to
//! the reader, the model description, the synthesizer or the report shows up here.

use strata_compiler::inspect;
use strata_compiler::pack::Pack;
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::Preset;
use strata_tests::synthetic_pack;

#[test]
fn tiny_qwen3moe_report() {
    let bytes = synthetic_pack(Preset::TinyQwen3Moe, 1, &[GgmlType::IQ1_M, GgmlType::IQ3_S, GgmlType::Q4_K]);
    let pack = Pack::from_bytes("tiny-qwen3moe.gguf", bytes).expect("valid");
    insta::assert_snapshot!(inspect::inspect(&pack).to_text());
}

#[test]
fn tiny_llama_model_json() {
    let bytes = synthetic_pack(Preset::TinyLlama, 2, &[GgmlType::Q4_0]);
    let pack = Pack::from_bytes("tiny-llama.gguf", bytes).expect("valid");
    let report = inspect::inspect(&pack);
    insta::assert_json_snapshot!((&report.model, &report.bytes_by_type));
}
