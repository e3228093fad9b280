//! Host launch code and device code take everything from the same plan record, and here
//! they are shown to agree for every kernel of every target, plain and `--checked`: the
//! parameters a GPU backend passes, in the order it passes them, are the parameters of
//! the rendered kernel's signature (`KernelRecord::in_signature_order`, which the GPU
//! backends' `launch_values` applies). (Wave size and block size are proven at build time
//! against the compiled binary: `artifacts::launch_disagreements`.) A mismatch here is
//! the kind of bug that shows up on a device only as a launch failure or a hang.

use strata_compiler::emit::{self, Dialect};
use strata_compiler::model::ModelDesc;
use strata_compiler::pack::Pack;
use strata_compiler::plan::{self, Options};
use strata_compiler::target;
use strata_tests::every_type_packs;

/// The parameter names of kernel `name` in its rendered source (`STRATA_ERR_PARAM` is the
/// error buffer in a checked build, nothing otherwise).
fn signature(text: &str, name: &str, checked: bool) -> Vec<String> {
    let start = text.find(&format!("void {name}(")).unwrap_or_else(|| panic!("{name}: no signature")) + name.len() + 6;
    let list = &text[start..start + text[start..].find(')').expect("closing parenthesis")];
    let list = list.replace("STRATA_ERR_PARAM", if checked { ", strata_err" } else { "" });
    list.split(',').filter_map(|p| p.split_whitespace().last().map(|w| w.trim_start_matches('*').to_owned())).collect()
}

#[test]
fn launch_arguments_follow_every_kernel_signature() {
    let dir = tempfile::tempdir().expect("tempdir");
    let packs: Vec<Pack> = every_type_packs(dir.path()).iter().map(|p| Pack::open(p).expect("opens")).collect();
    let mut checked_with_scalars = 0;
    for target in target::known() {
        for pack in &packs {
            let model = ModelDesc::from_pack(pack).expect("model");
            for checked in [false, true] {
                let options = Options { verify_window: 4, checked, ..Options::default() };
                let plan = plan::plan(&model, pack, &target, &options).expect("plannable");
                let module = emit::emit(&plan, &target, Dialect::native(&target)).expect("renders");
                for (spec, src) in plan.kernels.iter().zip(&module.kernels) {
                    // What `bind` hands a backend: buffers, then scalars.
                    let bound: Vec<&str> = spec
                        .buffers
                        .iter()
                        .map(|b| b.name.as_str())
                        .chain(spec.scalars.iter().map(|s| s.name.as_str()))
                        .collect();
                    let passed = spec.in_signature_order(&bound);
                    assert_eq!(passed, signature(&src.text, &spec.name, checked), "{} {}", target.name, spec.name);
                    checked_with_scalars += usize::from(checked && !spec.scalars.is_empty());
                }
            }
        }
    }
    assert!(checked_with_scalars > 0, "the case that needs reordering is covered");
}
