"""The coefficients of csrc/gelu_erf.h: gelu(x) = x / (1 + 2^(xc * q(xc^2))), xc = clamp(x, -6, 6),
q a polynomial of degree 4, fitted to torch's exact GELU (x * Phi(x)) by least squares reweighted
towards the largest errors (a minimax approximation), then checked in fp32 over [-20, 20].

    python3 docs/experiments/cutlass_gemm/gelu_fit.py     # needs numpy and scipy; prints q's
                                                          # coefficients, highest power first

Printed on the CPU machine: fp64 max err 3.5e-06, fp32 max err 4.0e-06.
"""
import numpy as np
from scipy.optimize import least_squares
from scipy.special import erf

C = 6.0                         # Phi(6) = 1 - 1e-9: past it the clamp changes nothing in fp32
L2E = 1 / np.log(2)


def gelu(x):
    return x * 0.5 * (1 + erf(x / np.sqrt(2)))


def ours(c, x):
    xc = np.clip(x, -C, C)
    q = np.polyval(c[::-1], xc * xc)
    return x / (1 + np.exp2(xc * q))


def main():
    x = np.linspace(0, C + 0.5, 100001)     # odd in x: the fit over x >= 0 serves both signs
    # start: the sigmoid form of tanh's GELU, 1.5958 x + 0.0713 x^3, in base 2
    c = -L2E * np.array([1.5958, 0.0713, 0.0, 0.0, 0.0])
    w = np.ones_like(x)
    for _ in range(60):
        c = least_squares(lambda cc: (ours(cc, x) - gelu(x)) * w, c, method="lm", xtol=1e-15, ftol=1e-15).x
        e = np.abs(ours(c, x) - gelu(x))
        w = w * (1 + (e / e.max()) ** 4)
        w /= w.mean()
    xs = np.linspace(-20, 20, 4000001)
    print("fp64 max err", np.abs(ours(c, xs) - gelu(xs)).max())
    c32, x32 = c.astype(np.float32), xs.astype(np.float32)
    xc = np.clip(x32, np.float32(-C), np.float32(C))
    q = np.float32(c32[-1])
    for a in c32[-2::-1]:
        q = (q * (xc * xc) + a).astype(np.float32)
    y = x32 / (np.float32(1) + np.exp2(xc * q).astype(np.float32))
    print("fp32 max err", np.abs(y.astype(np.float64) - gelu(xs)).max())
    print("q, highest power first:", ", ".join(f"{v:.9e}" for v in c32[::-1]))


if __name__ == "__main__":
    main()
