"""GEMMs whose tiles fill the SMs badly, routed to XLA (`route.choose`, `MAX_OVER_IDEAL`),
against the kernel's default config there, and XLA (NOTES exps. 140-141).

    python -m benchmarks.fill_route                     # on a Hopper GPU: every group
    python -m benchmarks.fill_route --group drawn54     # one group
    python -m benchmarks.fill_route                     # elsewhere: the plan only

Contenders (`benchmarks.default_ab`): xla; the default (routed: XLA's time); `kernel`,
the kernel with `heuristics.default_config`. Groups, in the order they were measured:
  long_k     K >= 8192: three held-out models' weight gradients that set the rule, then
             twelve drawn (random.seed(5)) from a grid after it
  short_k    the rule from K >= 2048: three shapes seen before it (stop 51), fourteen
             drawn (random.seed(52)) from M 512-16384, N 768-14336, K 1024-6144
  drawn53    drawn (random.seed(53)) after it: ten it routed, five under-filled it kept;
             the 64x128 exception (`route.SMALL_TILE`) was read off these
  drawn54    drawn (random.seed(54)) after the exception: ten it routes, four 64x128
             under-filled shapes it keeps (the kernel runs those)
  k1024      K 1024-1920: two losers of a random draw, twelve drawn (random.seed(55)) that
             a K >= 1024 rule would route; the 128-row condition
             (`route.UNDERFILLED_WIDE_MIN_K`) was read off these
  drawn56    drawn (random.seed(56)) after it: ten it routes, four 64x256 under-filled
             shapes it keeps (stop 53: the kernel lost on 9 of the 10)
  odd_m      an M off a multiple of 8 where A is stored (M, K): every shape of
             `benchmarks.random_shapes`' seeds 142-149 (300 each) that the rule would route
             if it asked only the row strides to be aligned (`route.xla_aligned`), timed
             before it did: the kernel lost on 25 of 28 (stop 53)

>>> default_plan(GROUPS["long_k"][0])
'xla'
"""

from __future__ import annotations

from benchmarks import default_ab
from benchmarks.default_ab import Case, default_plan

GROUPS = {
    "long_k": (
        Case(768, 3072, 16384, "TN"),  # heldout_models.json: set the rule
        Case(3072, 768, 16384, "TN"),
        Case(768, 768, 16384, "TN"),
        Case(512, 768, 8192, "NT"),  # drawn after it
        Case(512, 2048, 8192, "NT"),
        Case(768, 768, 8192),
        Case(768, 1024, 8192, "NT"),
        Case(768, 1536, 8192, "TN"),
        Case(1024, 768, 8192),
        Case(1024, 768, 8192, "TN"),
        Case(1024, 1024, 8192, "TN"),
        Case(1536, 768, 8192, "NT"),
        Case(1536, 768, 16384, "NT"),
        Case(1536, 1024, 8192, "NT"),
        Case(1536, 1536, 16384, "TN"),
    ),
    "short_k": (
        Case(1536, 3072, 2048),  # seen (stop 51: 0.81-0.86x)
        Case(1536, 3072, 2048, "NT"),
        Case(6144, 768, 2048, "TN"),
        Case(512, 1024, 6144, "TN"),  # drawn
        Case(512, 1536, 3072, "NT"),
        Case(512, 2560, 2048, "TN"),
        Case(512, 2560, 4096, "NT"),
        Case(768, 768, 4096, "NT"),
        Case(768, 1536, 6144),
        Case(768, 2048, 4096, "NT"),
        Case(1024, 768, 2048, "TN"),
        Case(1024, 768, 6144, "NT"),
        Case(1536, 1024, 6144, "TN"),
        Case(3072, 768, 6144, "TN"),
        Case(3072, 1536, 3072),
        Case(6144, 768, 2048, "NT"),
        Case(6144, 768, 4096, "NT"),
    ),
    "drawn53": (
        Case(640, 1536, 4096, "TN"),
        Case(768, 6144, 3072, "NT"),
        Case(1024, 768, 5120, "NT"),
        Case(1024, 1024, 5120),
        Case(1280, 1024, 7168, "NT"),
        Case(1536, 768, 6144, "TN"),
        Case(1536, 768, 7168, "TN"),
        Case(3072, 1536, 2048),
        Case(4096, 1280, 2560, "TN"),
        Case(6144, 768, 5120, "TN"),
        Case(512, 1536, 2560, "NT"),  # kept by the rule as drawn
        Case(512, 1536, 3584, "TN"),
        Case(1024, 768, 3584, "NT"),
        Case(1280, 1024, 2560, "NT"),
        Case(1536, 1024, 2048, "NT"),
    ),
    "drawn54": (
        Case(640, 2560, 3584),
        Case(768, 2048, 4096),
        Case(896, 2560, 2560),
        Case(1024, 896, 5120, "TN"),
        Case(1280, 896, 4096, "TN"),
        Case(1536, 768, 3584),
        Case(1536, 896, 2560),
        Case(1536, 3072, 6144, "TN"),
        Case(1792, 768, 2048, "TN"),
        Case(2048, 896, 3072, "TN"),
        Case(640, 1024, 2048, "NT"),  # 64x128 tiles: kept
        Case(768, 1024, 2560, "NT"),
        Case(896, 1024, 3072),
        Case(1024, 1024, 3072, "TN"),
    ),
    "k1024": (
        Case(512, 5696, 1904, "TN"),  # random_shapes (seed 142): 0.83x
        Case(2880, 1920, 1088, "NT"),  # 0.89x
        Case(768, 1536, 1280, "NT"),  # drawn
        Case(768, 1792, 1280, "NT"),
        Case(768, 1792, 1536, "TN"),
        Case(896, 2048, 1280, "NT"),
        Case(896, 11008, 1152, "NT"),
        Case(1024, 1536, 1024, "TN"),
        Case(1536, 1792, 1536, "TN"),
        Case(1536, 1792, 1792, "TN"),
        Case(1792, 1280, 1536),
        Case(2048, 896, 1024),
        Case(2048, 896, 1152, "TN"),
        Case(5120, 896, 1280),
    ),
    "drawn56": (
        Case(512, 6144, 1408, "TN"),
        Case(768, 6144, 1664, "NT"),
        Case(1280, 3584, 1920, "NT"),
        Case(1792, 1280, 1664),
        Case(2560, 2560, 1152),
        Case(3072, 1024, 1536),
        Case(3584, 896, 1024, "TN"),
        Case(3584, 1280, 1792, "TN"),
        Case(4096, 768, 1792, "TN"),
        Case(12288, 768, 1024, "TN"),
        Case(512, 3584, 1920),  # 64x256 tiles: kept
        Case(1024, 1280, 1408),
        Case(1024, 1792, 1024),
        Case(1792, 1024, 1408, "NT"),
    ),
    "odd_m": (
        Case(445, 1024, 15896),  # seed 142: 1.55x on the kernel
        Case(678, 4288, 5312),
        Case(477, 1024, 11008),
        Case(1571, 1024, 4864, "NT"),
        Case(391, 5632, 13312),  # seed 143
        Case(539, 1472, 4576, "NT"),  # 0.52-0.70x on the kernel (NOTES exp. 145)
        Case(793, 3776, 11328, "NT"),
        Case(521, 15296, 3136),
        Case(486, 2560, 2688, "NT"),
        Case(2346, 1280, 4864),  # seed 144
        Case(1373, 1728, 6080, "NT"),
        Case(1227, 1216, 4608, "NT"),  # seed 145
        Case(6524, 360, 3584, "NT"),
        Case(1241, 1856, 1216),
        Case(3293, 576, 1152),
        Case(1033, 1024, 10112),
        Case(1177, 1024, 5504),
        Case(1310, 1600, 1792, "NT"),  # seed 146
        Case(2666, 1728, 2088, "NT"),
        Case(3385, 384, 2624, "NT"),
        Case(685, 704, 14720, "NT"),
        Case(374, 2112, 5120, "NT"),
        Case(1444, 576, 13760, "NT"),
        Case(622, 2688, 5312, "NT"),  # seed 147
        Case(1183, 448, 10560, "NT"),  # seed 148
        Case(1750, 384, 9152),
        Case(1588, 1472, 10432, "NT"),  # seed 149
        Case(811, 1088, 8704, "NT"),
    ),
}


def main(argv=None) -> int:
  return default_ab.grouped_main(argv, __doc__.split("\n\n")[0], GROUPS)


if __name__ == "__main__":
  raise SystemExit(main())
