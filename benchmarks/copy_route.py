"""GEMMs whose row strides XLA reads as they are but whose arrays the kernel would copy
for TMA (`route.xla_aligned`, `route.padding_copy_bytes`), routed to XLA, against the
kernel there, and XLA (NOTES exp. 147).

    python -m benchmarks.copy_route                     # on a Hopper GPU: every group
    python -m benchmarks.copy_route --group drawn171    # one group
    python -m benchmarks.copy_route                     # elsewhere: the plan only

Contenders (`benchmarks.default_ab`): xla; the default (routed: XLA's time); `kernel`,
the kernel's default config. Groups:
  probe53    stop 53's probe: XLA-aligned shapes with copies (21 of 21 lost, 0.50-0.97x);
             the rule (`route.ALIGNED_COPY_FRACTION`) was read off these
  drawn171   drawn after it (`random_shapes.draw(seed, 100)`, seeds 171-181): the first
             twelve it routes and every NN/NT one among the first forty, then the two
             sweep shapes it moves (odd.json) and a test's example; timed before it
             was adopted: the kernel lost on 19 of 22 (0.52-0.91x)
  drawn202   an odd N where B is stored (N, K) sets C's row stride alone: the first
             fourteen of seeds 202-208 that the rule would route if `xla_aligned` asked A's
             and B's strides only. Not adopted as such: the kernel lost on 7 (0.42-0.99x,
             the large ones) and won on 6 (1.02-1.40x, the small ones). The fit of
             `route.slow_output_slice` (exp. 150): XLA's copy of the widened output
             into (M, N) at 0.85 TB/s against the roofline time
  drawn210   drawn after it (seeds 210-222): the first sixteen `slow_output_slice`
             routes, timed before it was adopted: the kernel lost on 12 (0.70-0.91x),
             won on 4 (1.01-1.24x)
  drawn300   what the memory-bound padding rule (`route.MAX_COPY_FRACTION`, set where XLA
             reads every stride as it is) routes among shapes XLA runs off its alignment:
             the first sixteen of seed 300 of at least 1 us, and two more

>>> default_plan(GROUPS["probe53"][0])
'xla'
"""

from __future__ import annotations

from benchmarks import default_ab
from benchmarks.default_ab import Case, default_plan

GROUPS = {
    "probe53": (
        Case(9280, 14072, 320),  # random_shapes seed 150: 0.52x (the output sliced)
        Case(6464, 448, 13930, "TN"),  # 0.50x
        Case(4736, 1864, 256, "TN"),  # 0.62x
        Case(896, 1600, 1048, "NT"),  # 0.64x
        Case(14584, 8384, 2240, "TN"),  # drawn (seeds 151-170), A's columns copied
        Case(704, 5576, 5440),
        Case(4672, 10920, 1640, "NT"),
        Case(448, 14936, 3776, "TN"),
        Case(5434, 704, 3792, "NT"),
        Case(4892, 1280, 16136),
        Case(8448, 16184, 960),
        Case(896, 9024, 6376, "NT"),
        Case(1216, 8256, 12136, "NT"),
        Case(5568, 5440, 2701, "TN"),  # TN with K off 8: A's and B's rows copied
        Case(2496, 6400, 958, "TN"),
        Case(3648, 7936, 5542, "TN"),
        Case(11072, 1152, 838, "TN"),
        Case(704, 13888, 3982, "TN"),
        Case(9472, 3136, 348, "TN"),
        Case(4096, 1216, 2994, "TN"),
        Case(1920, 7104, 7123, "TN"),
    ),
    "drawn171": (
        Case(5056, 3072, 7738, "TN"),
        Case(6592, 512, 2894, "TN"),
        Case(1280, 2560, 1513, "TN"),
        Case(256, 3712, 2802, "TN"),
        Case(512, 1152, 337, "TN"),
        Case(15872, 1024, 1010, "TN"),
        Case(1216, 768, 1037, "TN"),
        Case(256, 6976, 524, "TN"),
        Case(2048, 768, 804, "TN"),
        Case(4480, 3328, 4504),
        Case(320, 768, 4260, "TN"),
        Case(320, 448, 5300, "TN"),
        Case(640, 3008, 1192, "NT"),
        Case(6080, 1104, 15808),
        Case(5504, 14856, 576),
        Case(13120, 3072, 680),
        Case(384, 2120, 256, "NT"),
        Case(2240, 896, 10552),
        Case(2496, 5184, 784, "NT"),
        Case(1000, 1000, 1000),  # odd.json
        Case(3000, 5000, 7000),  # odd.json (H100: 0.76x)
        Case(1000, 1016, 4000),  # test_route's example of a copied B
    ),
    "drawn202": (
        Case(6144, 1405, 4288, "NT"),
        Case(384, 417, 768, "NT"),
        Case(640, 386, 448, "NT"),
        Case(576, 364, 448, "NT"),
        Case(960, 5101, 10352, "NT"),
        Case(11072, 4637, 3392, "NT"),
        Case(14016, 13494, 896, "NT"),
        Case(9806, 8623, 2880, "NT"),
        Case(512, 2779, 1152, "NT"),
        Case(512, 2998, 576, "NT"),
        Case(8384, 652, 256, "NT"),
        Case(2363, 1710, 5248, "NT"),
        Case(4416, 3548, 448, "NT"),
        Case(2364, 1821, 1088, "NT"),
    ),
    "drawn210": (
        Case(1856, 3967, 1408, "NT"),
        Case(4288, 6526, 1152, "NT"),
        Case(2880, 7451, 2432, "NT"),
        Case(2112, 14031, 1728, "NT"),
        Case(640, 15836, 1216, "NT"),
        Case(4608, 1108, 576, "NT"),
        Case(10816, 332, 512, "NT"),
        Case(384, 3770, 2432, "NT"),
        Case(9792, 1651, 576, "NT"),
        Case(2560, 11489, 768, "NT"),
        Case(7358, 15213, 2240, "NT"),
        Case(1088, 14345, 448, "NT"),
        Case(8531, 5300, 576, "NT"),
        Case(7680, 3235, 576, "NT"),
        Case(576, 2985, 1984, "NT"),
        Case(616, 4743, 808, "NT"),
    ),
    "drawn300": (
        Case(320, 2802, 7276),
        Case(4862, 261, 480),
        Case(768, 1024, 581),
        Case(3246, 448, 428),
        Case(320, 11359, 1920, "TN"),
        Case(448, 1344, 883),
        Case(4096, 3194, 349, "TN"),
        Case(320, 8741, 2240, "TN"),
        Case(1280, 2299, 384, "NT"),
        Case(320, 434, 13120, "TN"),
        Case(4928, 256, 7482, "NT"),
        Case(3191, 256, 320, "TN"),
        Case(2880, 256, 11833),
        Case(266, 1296, 2112, "TN"),
        Case(1280, 2747, 320),
        Case(16256, 256, 1882),
        Case(15104, 11605, 275, "NT"),  # random_shapes seed 261: the kernel 1.44x
        Case(65536, 64, 73),  # test_route's example of the rule (dropped: 0.60x)
    ),
}


def main(argv=None) -> int:
  return default_ab.grouped_main(argv, __doc__.split("\n\n")[0], GROUPS)


if __name__ == "__main__":
  raise SystemExit(main())
