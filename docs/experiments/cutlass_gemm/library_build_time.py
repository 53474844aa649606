"""Wall seconds of one of our libraries built from nothing in N parts: python3 library_build_time.py cutlass_gemm 3
(run with HTAM_CACHE_DIR set to an empty folder)."""
import os, sys, time
from torch_htam import build
name, parts = sys.argv[1], int(sys.argv[2])
lib = build.OUR_LIBRARIES[name]
build.OUR_LIBRARIES[name] = type(lib)(lib.flags, lib.version, lib.missing, lib.archs, parts)
t = time.time(); so, err = build.library(name, "sm_90a"); print(name, "parts", parts, "built" if so else err[:300], f"{time.time() - t:.1f} s", flush=True)
