#!/usr/bin/env bash
# CPU side of issue 19: vLLM 0.34.0 + torch 2.14.0 for the H200 image (torch 2.11.0+cu130, no network,
# 64 MiB per device call), as git-ignored carry folders .v34_01, .v34_02, ... of < 60 MB each, one folder
# per back-to-back device call. Run from the repo root; lab/gpu/vllm034_calls.py then prints the calls,
# and lab/gpu/vllm034_install.sh (device side) reassembles, verifies, installs and proves the stack.
# What is carried and why, and what was stripped: lab/gpu/vllm034_README.md.
#
#   bash lab/gpu/vllm034_prepare.sh          # downloads (cached), strips, splits, writes the manifest
#   V34_CALL_BYTES=50000000 bash ...             # smaller folders (default 54,000,000 bytes a call)
#   V34_CACHE=/path bash ...                     # where the downloaded wheels are kept between runs
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
# A call carries a folder and the tracked files (8.0 MB on 2026-12-04, when 60 MB folders were
# refused): 54 MB leaves the docs about 5 MB to grow within 64 MiB.
call_bytes="${V34_CALL_BYTES:-54000000}"
cache="${V34_CACHE:-$HOME/.cache/dspark/v34}"
mkdir -p "$cache/wheels"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT

# One explicit pinned list, hash-locked (the sha256 PyPI publishes for each file): what vLLM 0.34 and
# torch 2.14 need that the image lacks or has too old (typing-extensions: may have too old). The README
# says which is which, and which declared needs are left out and why.
cat >"$work/pins.txt" <<'EOF'
torch==2.14.0 --hash=sha256:fecffb58f51fd643d213acd68da21cc3fc19bea05a3bc64b4ee55128f47a4963
vllm==0.34.0 --hash=sha256:79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2
triton==3.8.0 --hash=sha256:e91ffa46d095b252248297292dd22bcbacd53a125a0c2eefbbbf74925a320bc3
nvidia-nccl-cu13==2.30.7 --hash=sha256:cefa7fdb9710efd0f39c5f1be1d61ff6fc9a996c451265bd7fbdcf9455ed4b50
flashinfer-python==0.7.4 --hash=sha256:a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32
apache-tvm-ffi==0.1.11 --hash=sha256:2843f084cdc94dedacd8b257a395a2b71b8a3dc7fc99711b148bf1d161983128
nvidia-cudnn-frontend==1.32.0 --hash=sha256:8b354a8e550c083eb247f1eb39a7d69a4a269075f5a01e4fcbd2531680b17239
torchvision==0.29.0 --hash=sha256:0e631a2f8b24732672d35224d2574ff89a78d56bef5364ef6094a625fa5f1771
nvtx==0.2.15 --hash=sha256:3ca8030a6d197952318013dd1c12c22da1d4b9feb76ba72e0fcd449961183c2c
huggingface-hub==2.4.0 --hash=sha256:42ecfd93ede47bdd333daebbf66a32d7bfe2e18752754fe4d2d4f98a0179d801
transformers==5.22.2 --hash=sha256:829c2820aff91730b8ec45a4b8ff4be07f586a140b68a9073998b36fa35297dc
tokenizers==0.23.3 --hash=sha256:376851d22bcf9d650a5c3090bb83e6cf9e895fbf0595369fa4cd43c1f69b5f87
httpx2==2.16.2 --hash=sha256:f05c13aade4c45dbf1c9060647a1058f0acad62398fad96e741269edb33d46f5
httpcore2==2.16.2 --hash=sha256:16051ae2a42f776007543f32de9349a317b23d2cbb4e1456b4bac0e88b87419a
truststore==0.10.5 --hash=sha256:9aaaedaefaf06d8b206278cf8b5012bc897f485a874503501e12d776df78951c
cachetools==8.0.2 --hash=sha256:502bf3c17c6e35d78ccdaa70da8c7001b28634541f5cde0dee33c93bb252277d
blake3==1.0.11 --hash=sha256:33424c686b291c7682b5816fe9320466dbc0a457ef7e15c273c804a2d70fea70
cbor2==6.3.0 --hash=sha256:4f160b662059cc30ced4436fca332f4c27d0259698a5bde8373c9c6f829aabdf
msgspec==0.23.0 --hash=sha256:c08f294663135183bd633efd843645687285a445054a876c37506d4e9de7d80b
pyzmq==27.3.0 --hash=sha256:858fe25231e0fd8612da142efde019faa5ef63fa150a821a27870e791b38c798
pybase64==1.5.1 --hash=sha256:c212d02fd072c5845d39b4699eb65efa827b79a5cf7fecc9f468f8cad2b8540f
ijson==3.6.0 --hash=sha256:c14d568d31a322e8ed7e9735f6e355608a23cc6ff4b5da843515089dae4cbf5f
setproctitle==1.3.8 --hash=sha256:4a765e0c80a2453480be27c4fc22ba1c0771867040c5f91e4221940d78a4abfb
partial-json-parser==0.2.1.1.post7 --hash=sha256:145119e5eabcf80cbb13844a6b50a85c68bf99d376f8ed771e2a3c3b03e653ae
python-json-logger==4.2.0 --hash=sha256:158a52126fcd6869e09574d2b66272666f3dc8f468c62637ef9a1fa883719cb9
watchfiles==1.3.0 --hash=sha256:b5768b49e426fd5b550b012c866db347cdf15c398ef98dc557b6e6b72fa74cd1
orjson==3.13.0 --hash=sha256:bceadfd314bd238f584fc229a4bbaf0e573597e7a026dec5429fbf29fd66c641
prometheus-fastapi-instrumentator==8.1.0 --hash=sha256:b9f40b2cff3f7891ca0610b3ae4fc6ec723fd326b04bb659819aaeb821a0fc7d
pydantic==2.14.4 --hash=sha256:653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc
pydantic-core==2.50.5 --hash=sha256:470bbc2495367f60d3ca849a8039e4c164701d10637e7743f4427d92651bdb6d
annotated-types==0.8.0 --hash=sha256:f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0
typing-inspection==0.4.5 --hash=sha256:bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39
typing-extensions==4.16.0 --hash=sha256:481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8
fastapi==0.136.3 --hash=sha256:3d2a69bdf04b7e9f3afa292c3bc7a98816bbfafa10bc9b45f3f3700d2f761620
starlette==1.10.0 --hash=sha256:478c0ab3b4ced6e82719849c118fa406f0278a3499c1a898cd15cd31bdc38ce4
uvicorn==0.55.0 --hash=sha256:bee604c5af6e15fb0584913c632b222c09db1048c26fc05053203207c4b9e37d
sniffio==1.3.1 --hash=sha256:2f6da418d1f1e0fddd844478f41680e794e6051915791a034ff65e5f100525a2
python-multipart==0.0.34 --hash=sha256:ebacd224bd686eee2f9aa1066a657affe07435a185834e05e5235e2e59173e91
openai==3.60.0 --hash=sha256:476e79f256a4ce74848b7abae9f074352a69dca6e7e8987d565ee883a3b7e496
jiter==0.19.0 --hash=sha256:0956b5f58b804221dfb929c120e6d4032138fed20c1cc0ef683a2d1326255e46
oss-harmony==0.0.11 --hash=sha256:d877c6b526cdbdf55068bae8f05c60398e929c9e296c7f69a1d533339708be80
compressed-tensors==0.17.0 --hash=sha256:4a1b89b508f7efb8ffb4eee8a6e69e0452d9b080cae130146025c64fbe9fa9aa
loguru==0.7.3 --hash=sha256:31a33c10c8e1e10422bfd431aeb5d351c7cf7fa671e3c4df004162264b28220c
depyf==0.20.0 --hash=sha256:d31effad4261cebecb58955d832e448ace88f432328f95f82fd99c30fd9308d4
astor==0.8.1 --hash=sha256:070a54e890cefb5b3739d19f30f5a5ec840ffc9c50ffa7d23cc9fc1a38ebbfc5
dill==0.4.1 --hash=sha256:1e1ce33e978ae97fcfcff5638477032b801c46c7c65cf717f95fbc2248f79a9d
lark==1.2.2 --hash=sha256:c2276486b02f0f1b90be155f2c8ba4a8e194d42775786db622faccd652d8e80c
lm-format-enforcer==0.11.3 --hash=sha256:cf586350875def1ae7a8fba84fcbbfc8371424b6c9d05c1fcba70aa233fbf06f
interegular==0.3.3 --hash=sha256:b0c07007d48c89d6d19f7204972d369b2a77222722e126b6aa63aa721dc3b19c
outlines-core==0.2.14 --hash=sha256:3bb2060c240c4507f334965a8948dbeeb22007560d797f6debd92346c0b620cb
xgrammar==0.2.8 --hash=sha256:4045b096735bb2523e0d874039a55994c1b390620d547c4a0d4f43b9a106177b
llguidance==1.7.6 --hash=sha256:ceec951d29a74309984e3be0fe7f5f56c1362434cd937abd517b259a60908b1e
jsonschema==4.26.0 --hash=sha256:d489f15263b8d200f8387e64b4c3a75f06629559fb73deb8fdfb525f2dab50ce
jsonschema-specifications==2025.9.1 --hash=sha256:98802fee3a11ee76ecaca44429fda8a41bff98b00a0f2838151b113f210cc6fe
referencing==0.37.0 --hash=sha256:381329a9f99628c9069361716891d34ad94af76e461dcb0335825aecc7692231
rpds-py==2026.9.1 --hash=sha256:addeda51556dac7c1a2f14cda62db8b621cd12afba3091d03a96c72932387eab
model-hosting-container-standards==0.1.16 --hash=sha256:47f4f65713120bc3a69feb022981a38db9e557aedf88dbd72077f20588caa12b
jmespath==1.1.0 --hash=sha256:a5663118de4908c91729bea0acadca56526eb2698e83de10cd116ae0f4e97c64
supervisor==4.3.0 --hash=sha256:0bcb763fddafba410f35cbde226aa7f8514b9fb82eb05a0c85f6588d1c13f8db
certifi==2026.10.19.post1 --hash=sha256:1324c476b4811eff41a8bc2122cd0bbd4d9c7234c725446d99ab1612b3a7fdd2
filelock==4.3.2 --hash=sha256:02a8801bc6b2a80921bf3d7895c63084d53bae2a3c86783adce5ae2b89a1825b
pillow==13.0.0 --hash=sha256:42d63be3af4f9b951b199b0a9d23365d37ab14687e6d77b74940432c8515c4ca
EOF

# cp312 wheels for manylinux x86_64 (the image is Python 3.12.3; the newest tag used is llguidance's 2_31).
plat=()
for n in 31 28 27 26 25 24 18 17 12 5; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform any)
echo "[v34] downloading $(grep -c . "$work/pins.txt") pinned wheels into $cache/wheels (kept for the next run)"
# The machine's pip config lists local index folders that lack most names; drop only that warning.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${plat[@]}" -d "$cache/wheels" -r "$work/pins.txt" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

# Exactly one wheel per pin (an older run's other versions may sit in the cache).
mkdir "$work/out"
python3 - "$work/pins.txt" "$cache/wheels" "$work/out" <<'PY'
import hashlib, os, re, shutil, sys
pins, cache, out = sys.argv[1:]
canon = lambda n: re.sub(r"[-_.]+", "-", n).lower()
want = {}
for line in open(pins):
    spec, _, h = line.strip().partition(" --hash=sha256:")
    name, _, ver = spec.partition("==")
    want[(canon(name), ver)] = h
found = {}
for fn in os.listdir(cache):
    if not fn.endswith(".whl"):
        continue
    name, ver = fn.split("-")[:2]
    key = (canon(name), ver)
    if key in want:
        found.setdefault(key, []).append(fn)
for key, h in want.items():
    files = [f for f in found.get(key, []) if hashlib.sha256(open(os.path.join(cache, f), "rb").read()).hexdigest() == h]
    if len(files) != 1:
        sys.exit(f"[v34] {key[0]}=={key[1]}: expected one wheel with sha256 {h} in {cache}, found {files}")
    shutil.copy2(os.path.join(cache, files[0]), out)
print(f"[v34] {len(want)} wheels, {sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)) / 1e6:.1f} MB before stripping")
PY

# Strip what an H200 run never loads, deleting zip entries in place (no recompression) and dropping them
# from RECORD. Patterns match the wheel's entry names (fnmatch: '*' spans '/'); '!PATTERN' keeps a match.
strip() {  # strip WHEEL PATTERN...
  local whl="$1"; shift
  python3 - "$whl" "$work/strip" "$@" <<'PY'
import csv, fnmatch, io, os, subprocess, sys, zipfile
whl, tmp, pats = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(whl) as z:
    names = z.namelist()
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    rows = list(csv.reader(io.TextIOWrapper(z.open(record), "utf-8", newline="")))
keep = [p[1:] for p in pats if p.startswith("!")]
pats = [p for p in pats if not p.startswith("!")]
gone = [n for n in names if not n.endswith("/") and any(fnmatch.fnmatch(n, p) for p in pats)
        and not any(fnmatch.fnmatch(n, k) for k in keep)]
for p in pats:
    if not any(fnmatch.fnmatch(n, p) for n in gone):
        sys.exit(f"[v34] {os.path.basename(whl)}: nothing matches {p!r} (did the wheel's layout change?)")
with zipfile.ZipFile(whl) as z:
    freed = sum(z.getinfo(n).compress_size for n in gone)
subprocess.run(["zip", "-q", "-d", "-nw", whl, "-@"], input="\n".join(gone) + "\n", text=True, check=True)
drop = set(gone)
os.makedirs(os.path.join(tmp, os.path.dirname(record)), exist_ok=True)
with open(os.path.join(tmp, record), "w", newline="") as f:
    csv.writer(f, lineterminator="\n").writerows(r for r in rows if r and r[0] not in drop)
subprocess.run(["zip", "-q", whl, record], cwd=tmp, check=True)
print(f"[v34] {os.path.basename(whl)}: stripped {len(gone)} files, {freed / 1e6:.1f} MB compressed")
PY
  rm -rf "$work/strip"
}
# vLLM: FA2 (FA3 serves Hopper), the Rust front end (opt-in, VLLM_USE_RUST_FRONTEND), and third_party's
# binaries and JIT headers (vendored DeepGEMM for FP8 and Blackwell FMHA); its .py files stay (pynvml).
strip "$work"/out/vllm-0.34.0-*.whl 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm-rs' \
  'vllm/third_party/*' '!vllm/third_party/*.py'
# Triton: the Blackwell ptxas (used for sm_100+ only), the debug disassemblers, both bundled CUPTIs (only
# Triton's proton profiler dlopens them; torch's profiler uses the image's own CUPTI), and proton's
# instrumentation test library.
strip "$work"/out/triton-3.8.0-*.whl 'triton/backends/nvidia/bin/ptxas-blackwell' \
  'triton/backends/nvidia/bin/cuobjdump' 'triton/backends/nvidia/bin/nvdisasm' \
  'triton/backends/nvidia/lib/cupti-blackwell/*' 'triton/backends/nvidia/lib/cupti/*' \
  'triton/instrumentation/libGPUInstrumentationTestLib.so'
# torch: the protobuf compiler (a build tool; nothing at run time calls it).
strip "$work"/out/torch-2.14.0-*.whl 'torch/bin/protoc' 'torch/bin/protoc-*'

# Split into one folder per call and write the manifest (sha256 of every part and of every whole wheel).
python3 - "$work/out" "$repo" "$call_bytes" <<'PY'
import datetime, hashlib, os, shutil, sys
out, repo, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
for d in os.listdir(repo):
    if d.startswith(".v34_") and d[5:].isdigit():
        shutil.rmtree(os.path.join(repo, d))
files = sorted(os.listdir(out), key=lambda f: (-os.path.getsize(os.path.join(out, f)), f))
reserve = 64_000  # the manifest rides in the first folder
folders, free, lines, parts = [[]], cap - reserve, [], 0
def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()
for fn in files:
    path = os.path.join(out, fn); size = os.path.getsize(path)
    lines.append(f"file {sha(path)} {size} {fn}")
    with open(path, "rb") as src:
        off, k = 0, 0
        while off < size:
            if free == 0:
                folders.append([]); free = cap
            n = min(free, size - off)
            name = f"{fn}.p{k:02d}"
            folder = f".v34_{len(folders):02d}"
            os.makedirs(os.path.join(repo, folder), exist_ok=True)
            data = src.read(n)
            with open(os.path.join(repo, folder, name), "wb") as dst:
                dst.write(data)
            lines.append(f"part {hashlib.sha256(data).hexdigest()} {n} {folder} {name}")
            folders[-1].append(name); free -= n; off += n; k += 1; parts += 1
head = [f"# vLLM 0.34 carry manifest, lab/gpu/vllm034_prepare.sh, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# calls {len(folders)} wheels {len(files)} parts {parts} bytes {sum(os.path.getsize(os.path.join(out, f)) for f in files)}",
        "# file SHA256 BYTES WHEEL   (the reassembled wheel; its parts follow in order)",
        "# part SHA256 BYTES FOLDER PART"]
with open(os.path.join(repo, ".v34_01", "V34_MANIFEST"), "w") as f:
    f.write("\n".join(head + lines) + "\n")
assert os.path.getsize(os.path.join(repo, ".v34_01", "V34_MANIFEST")) < reserve
PY

excl="$(git rev-parse --git-path info/exclude)"; mkdir -p "$(dirname "$excl")"; touch "$excl"
for d in .v34_[0-9][0-9]; do grep -qxF "/$d/" "$excl" || echo "/$d/" >>"$excl"; done
n_calls=$(find . -maxdepth 1 -name '.v34_[0-9][0-9]' -type d | wc -l)
total=$(cat .v34_[0-9][0-9]/* | wc -c)
biggest=$(for d in .v34_[0-9][0-9]; do cat "$d"/* | wc -c; done | sort -n | tail -1)
tracked=$(git ls-files -z | xargs -0 cat 2>/dev/null | wc -c)
du -sh .v34_[0-9][0-9] | tr '\n' ' '; echo
echo "[v34] total $((total / 1000000)) MB in $n_calls calls (largest folder $biggest bytes; tracked files" \
  "$tracked bytes; a call carries at most $((biggest + tracked)) of 67108864)"
echo "[v34] next: python3 lab/gpu/vllm034_calls.py"
