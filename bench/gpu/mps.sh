# Sourced by the GPU steps whose ranks share one GPU (bench/gpu/steps/*.sh).
#
# start_mps LOG: starts NVIDIA's MPS daemon with private pipe and log folders under /tmp (exported,
# so that every rank the step starts finds it), its output appended to LOG. Under MPS the ranks'
# kernels run on the GPU side by side; without it they time-slice it and each collective between
# them costs ~4.5 ms. Returns 0 when it started the daemon, which an EXIT trap of the step's shell
# then stops; 1 when there is no nvidia-cuda-mps-control or the daemon did not start (the caller
# says what that means for its figures).
start_mps() {
  local log="$1"
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/bagua-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/bagua-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  command -v nvidia-cuda-mps-control > /dev/null || return 1
  nvidia-cuda-mps-control -d >> "$log" 2>&1 || return 1
  # shellcheck disable=SC2064  # the log's path is fixed now
  trap "echo quit | nvidia-cuda-mps-control >> $(printf '%q' "$log") 2>&1" EXIT
}
