#!/usr/bin/env python3
"""The float64 reference forward (tests/py/reference.py) with every weight
matmul's input rounded to 8 bits per 32 values (llama.cpp's Q8
activations), against specd's logits dumps (docs/benchmarks.md, "The
default weights"). Expects /tmp/c_q.json (`specd --weights quantized debug
logits --chat --json /tmp/c_q.json "What is the capital of France?"`) and
/tmp/c_avx512.json, /tmp/c_avx2.json, /tmp/c_sc.json (the same with
`--weights int8`, SPECD_KERNEL_ISA unset, avx2, scalar). Run from tests/py.
"""
import sys, json, numpy as np
sys.path.insert(0, '.')
import reference as R
from specd_paths import model_path
ref = R.Reference(str(model_path("smollm2:135m")))
ids = json.load(open('/tmp/c_q.json'))['prompt_ids']
def q8(x):
    s = x.shape; y = x.reshape(-1, s[-1] // 32, 32)
    d = np.abs(y).max(-1, keepdims=True) / 127
    d[d == 0] = 1
    return (np.round(y / d) * d).reshape(s)
exact = ref.logits(ids)[-1]
orig = np.ndarray.__matmul__
# patch: quantize the left operand of every weight matmul (h @ W.T)
src = open('reference.py').read()
import types
R2 = types.ModuleType('r2'); 
src2 = src.replace('h @ self.w', 'q8(h) @ self.w').replace('o @ self.w', 'q8(o) @ self.w').replace('* u) @ self.w', '* u).__array__() @ self.w').replace('return x @ head.T', 'return q8(x) @ head.T')
src2 = src2.replace('((g / (1.0 + np.exp(-g))) * u).__array__() @ self.w', 'q8((g / (1.0 + np.exp(-g))) * u) @ self.w')
R2.__dict__['q8'] = q8
exec(compile(src2, 'r2', 'exec'), R2.__dict__)
ref2 = R2.Reference(str(model_path("smollm2:135m")))
q = ref2.logits(ids)[-1]
spec_q = np.array(json.load(open('/tmp/c_q.json'))['logits'])
for n in ['c_avx512','c_avx2','c_sc']:
    x = np.array(json.load(open(f'/tmp/{n}.json'))['logits'])
    print(n, 'vs numpy-q8', abs(x-q).max(), np.linalg.norm(x-q)/np.linalg.norm(q))
print('numpy q8 vs exact', abs(q-exact).max(), np.linalg.norm(q-exact)/np.linalg.norm(exact), 'argmax', q.argmax(), exact.argmax())
print('specd quantized vs exact', abs(spec_q-exact).max())
print('head of q8 ref top', np.argsort(q)[-3:][::-1], np.sort(q)[-3:][::-1])
