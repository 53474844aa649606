"""Does Dynamo re-import an inlined forward's module by name (torch 2.11, pytorch#181243)?
Old compile_with (a fresh code object with torch_htam.inductor's globals) vs fresh_call."""
import importlib.util, itertools, sys, torch
spec = importlib.util.spec_from_file_location("kb_problem_probe", "scripts/probe_unimportable_model.py")
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
m = mod.Model().cuda().eval(); x = torch.randn(4, 16, device="cuda")
from torch_htam import inductor
def old_style(model):
    def call(*a, **k):
        return model._call_impl(*a, **k)
    call.__code__ = call.__code__.replace(co_name="htam_call_old")
    return torch.compile(call)
for name, f in [("old", old_style(m)), ("new", inductor.compile_with(m, None))]:
    try:
        with torch.no_grad(): f(x)
        print(name, "OK")
    except Exception as e:
        print(name, "FAIL", type(e).__name__, str(e).splitlines()[0][:150])
