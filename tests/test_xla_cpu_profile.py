"""experiments.xla_cpu_profile: conv thunks are matched to their shapes from the compiled HLO."""

from __future__ import annotations

from experiments.xla_cpu_profile import conv_signatures

CONV = ("  ROOT %convolution.102 = f32[1,56,56,128]{3,2,1,0} convolution(%param_0.49, %param_1.49), "
        "window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=32")
HLO = f"""
%fused_computation.49 (param_0.49: f32[1,56,56,128], param_1.49: f32[3,3,4,128]) -> f32[1,56,56,128] {{
  %param_0.49 = f32[1,56,56,128]{{3,2,1,0}} parameter(0)
  %param_1.49 = f32[3,3,4,128]{{3,2,1,0}} parameter(1)
{CONV}
}}

%fused_computation.50 (param_0.50: f32[1,56,56,64]) -> f32[1,56,56,64] {{
  ROOT %maximum.1 = f32[1,56,56,64]{{3,2,1,0}} maximum(%param_0.50, %param_0.50)
}}

ENTRY %main {{
  %ynn_fusion.49 = f32[1,56,56,128]{{3,2,1,0}} fusion(%a, %b), kind=kCustom, calls=%fused_computation.49, metadata={{op_name="x"}}
  %broadcast_maximum_fusion.3 = f32[1,56,56,64]{{3,2,1,0}} fusion(%c), kind=kLoop, calls=%fused_computation.50
}}
"""


def test_conv_fusions_are_matched_to_their_output_window_and_groups() -> None:
    assert conv_signatures(HLO) == {"ynn_fusion.49": ((1, 56, 56, 128), "size=3x3 pad=1_1x1_1", 32)}
