# Sourced, here and on the device: the `strata-compile` arguments of the packs the
# prompt-chunk check (prefill-check.sh) makes on both sides, so both make the same pack.

# Every type with an int8 decoder (the int8 GEMMs), 2048 wide: rows of whole 16-byte pieces.
MIX_Q8="synth --preset llama-1b --layers 2 --vocab 512 --type IQ1_M,IQ2_XS,IQ3_XXS,IQ3_S,Q4_0,Q4_1,Q8_0,Q4_K,Q6_K --seed 21"
