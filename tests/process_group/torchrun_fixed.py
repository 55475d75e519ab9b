#!/usr/bin/python3
"""torchrun for Debian's torch 1.13 under Python 3.11.

Bug: torch.distributed.elastic.multiprocessing.api.Std.from_str() converts a
digit with `for s in Std: if s == v: return s`.  Since Python 3.11, iterating an
IntFlag yields only canonical single-bit members (OUT=1, ERR=2), so "0" (NONE)
and "3" (ALL) map to None; the default `--redirects 0 --tee 0` then crashes in
multiprocessing.to_map (AttributeError: 'NoneType' object has no attribute 'get').
Fix: convert with Std(int(v)), which accepts any value of the flag.

Usage: /usr/bin/python3 torchrun_fixed.py [torchrun args...]
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api as _mp_api

_Std = _mp_api.Std
# torch 2.x parses the flag with Std(int(v)) itself (and may drop the regexes this patch reads):
# patch only a torch that still has the loop.
_NEEDS_PATCH = hasattr(_mp_api, "_VALUE_REGEX") and hasattr(_mp_api, "_MAPPING_REGEX")


def _from_str(cls, vm):
    if re.match(_mp_api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(_mp_api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(
        f"{vm} does not match: <{_mp_api._VALUE_REGEX}> or <{_mp_api._MAPPING_REGEX}>")


# Same class object is re-exported as torch.distributed.elastic.multiprocessing.Std
# and imported by torch.distributed.run, so patching the class fixes every user.
if _NEEDS_PATCH:
    _Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main
    sys.exit(main())
