# Sourced on the GPU machine: the unpacked packages first, then the repository; TVM's CUDA
# runtime links libcudart.so.13, which the image's PyTorch ships in an nvidia package.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PYTHONPATH=$root/.devsite:$root
cudart=$(python3 -c "
import glob, os, site
hits = [p for d in site.getsitepackages() for p in glob.glob(d + '/nvidia/**/libcudart.so.13*', recursive=True)]
print(os.path.dirname(hits[0]) if hits else '')" 2>/dev/null)
export LD_LIBRARY_PATH=${cudart:+$cudart:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PARAGRAPH_CACHE_DIR=$root/.devstage/cache PYTHONUNBUFFERED=1
export PATH=/usr/local/cuda/bin:$PATH
