"""Flag parsing shared by the package's console scripts (absl).

>>> from absl import flags
>>> values = flags.FlagValues()
>>> _ = flags.DEFINE_bool("dry_run", False, "time nothing", flag_values=values)
>>> parse_flags(["tool", "--dry-run"], values), values.dry_run
(['tool'], True)
"""

from __future__ import annotations

import sys

from absl import flags


def parse_flags(argv, flag_values: flags.FlagValues = flags.FLAGS):
  """absl parsing that also accepts dashes in flag names (`--dry-run`). For a tool's own
  `FlagValues`, `--help` prints its flags with their defaults and exits."""

  def underscored(arg):
    if not arg.startswith("--"):
      return arg
    name, eq, value = arg.partition("=")
    return name[:2] + name[2:].replace("-", "_") + eq + value

  args = [underscored(arg) for arg in argv[1:]]
  if flag_values is not flags.FLAGS and any(a in ("-h", "--help", "--helpfull") for a in args):
    print(flag_values.get_help())
    sys.exit(0)
  remaining = flag_values([argv[0]] + args)
  if flag_values is not flags.FLAGS and not flags.FLAGS.is_parsed():
    flags.FLAGS([argv[0]])  # absl's app.run wants the global flags parsed too
  return remaining
