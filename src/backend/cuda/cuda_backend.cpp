#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_matmul.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tensor_views.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/tuning.h"

namespace pagellm {
namespace cuda {

[[noreturn]] void cuda_failed(cudaError_t err, const char* call, const char* file, int line) {
  std::fprintf(stderr, "CUDA error at %s:%d: %s failed: %s (%s)\n", file, line, call,
               cudaGetErrorName(err), cudaGetErrorString(err));
  std::fflush(stderr);
  std::abort();
}

[[noreturn]] void cublas_failed(cublasStatus_t st, const char* call, const char* file, int line) {
  std::fprintf(stderr, "cuBLAS error at %s:%d: %s failed: %s (%d)\n", file, line, call,
               cublasGetStatusString(st), static_cast<int>(st));
  std::fflush(stderr);
  std::abort();
}

namespace {

class CudaBuffer final : public Buffer {
 public:
  // Takes memory that cudaMalloc gave (null for 0 bytes).
  CudaBuffer(void* data, int64_t nbytes, std::shared_ptr<std::atomic<uint64_t>> epoch)
      : data_(data), nbytes_(nbytes), epoch_(std::move(epoch)) {}
  ~CudaBuffer() override {
    if (data_ != nullptr) {
      cudaFree(data_);  // best effort: nothing useful to do on failure here
      ++*epoch_;        // recordings that used this memory are stale now
    }
  }
  void* data() const override { return data_; }
  int64_t nbytes() const override { return nbytes_; }
  Device device() const override { return Device::kCuda; }

 private:
  void* data_ = nullptr;
  int64_t nbytes_ = 0;
  std::shared_ptr<std::atomic<uint64_t>> epoch_;
};

class CudaGraph final : public OpGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }  // best effort, as for buffers
  void replay() override { CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

bool is_float_type(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// Every tensor an op touches must live on the GPU (a host pointer here is a planning bug).
void check_on_device(const Tensor& t, const char* what) {
  if (t.device != Device::kCuda) {
    std::fprintf(stderr, "cuda backend: tensor '%s' %s is not on the CUDA device\n", what,
                 t.shape_string().c_str());
    PAGELLM_CHECK_MSG(false, "tensor passed to the CUDA backend is not a device tensor");
  }
}

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

}  // namespace

CudaBackend::CudaBackend(int device_index) : device_(device_index) {
  CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  n_sms_ = prop.multiProcessorCount;
  cluster_ok_ = prop.major >= 9;
  name_ = "cuda:" + std::to_string(device_) + " (" + prop.name + ", sm_" +
          std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<Gemm>(stream_);
  CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
  side_gemm_ = std::make_unique<Gemm>(side_stream_);
  CUDA_CHECK(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming));
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned_), kSlots * kSlotBytes));
  for (auto& e : slot_events_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_CHECK(cudaStreamCreateWithFlags(&sample_stream_, cudaStreamNonBlocking));
  for (SampleSlot& slot : sample_slots_) {
    for (cudaEvent_t* e : {&slot.uploaded, &slot.sampled, &slot.done})
      CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&handover_), (1 + kHandoverRows) * 4));
  CUDA_CHECK(cudaMemsetAsync(handover_, 0, (1 + kHandoverRows) * 4, stream_));
}

CudaBackend::~CudaBackend() {
  // Best effort: a destructor cannot report errors, and a failed sync here means the context is
  // already gone.
  cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(side_stream_);
  cudaStreamSynchronize(sample_stream_);
  if (chain_times_ != nullptr) log_chain_times();
  gemm_.reset();
  side_gemm_.reset();
  if (fork_event_ != nullptr) cudaEventDestroy(fork_event_);
  if (join_event_ != nullptr) cudaEventDestroy(join_event_);
  for (auto& e : slot_events_)
    if (e != nullptr) cudaEventDestroy(e);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (upload_staging_ != nullptr) cudaFree(upload_staging_);
  if (attn_workspace_ != nullptr) cudaFree(attn_workspace_);
  for (SampleSlot& slot : sample_slots_) {
    if (slot.host != nullptr) cudaFreeHost(slot.host);
    if (slot.dev != nullptr) cudaFree(slot.dev);
    for (cudaEvent_t e : {slot.uploaded, slot.sampled, slot.done})
      if (e != nullptr) cudaEventDestroy(e);
  }
  if (handover_ != nullptr) cudaFree(handover_);
  if (greedy_scratch_ != nullptr) cudaFree(greedy_scratch_);
  if (sample_stream_ != nullptr) cudaStreamDestroy(sample_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (side_stream_ != nullptr) cudaStreamDestroy(side_stream_);
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int device_index) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess)
    return internal_error(std::string("CUDA runtime unavailable: ") + cudaGetErrorName(err) + ": " +
                          cudaGetErrorString(err));
  if (n == 0) return not_found("no CUDA device present");
  if (device_index < 0 || device_index >= n)
    return out_of_range("CUDA device " + std::to_string(device_index) + " does not exist (" +
                        std::to_string(n) + " device(s) present)");
  return std::unique_ptr<CudaBackend>(new CudaBackend(device_index));
}

// --- memory ---

std::unique_ptr<Buffer> CudaBackend::allocate(int64_t nbytes) {
  PAGELLM_CHECK(nbytes >= 0);
  void* data = nullptr;
  if (nbytes > 0) {
    const cudaError_t err = cudaMalloc(&data, static_cast<size_t>(nbytes));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // an allocation that failed leaves the device usable: clear it
      return nullptr;      // the caller reports it (Backend::allocate)
    }
    if (err != cudaSuccess) cuda_failed(err, "cudaMalloc", __FILE__, __LINE__);
  }
  return std::make_unique<CudaBuffer>(data, nbytes, epoch_);
}

int64_t CudaBackend::free_memory() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

int CudaBackend::next_slot() {
  const int s = slot_;
  slot_ = (slot_ + 1) % kSlots;
  CUDA_CHECK(cudaEventSynchronize(slot_events_[s]));  // its previous copy has finished
  return s;
}

void CudaBackend::copy_from_host(void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  if (nbytes <= kSlotBytes) {
    const int s = next_slot();
    char* slot = pinned_ + s * kSlotBytes;
    std::memcpy(slot, src, static_cast<size_t>(nbytes));
    CUDA_CHECK(cudaMemcpyAsync(dst, slot, nbytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(slot_events_[s], stream_));
  } else {
    // Pageable source: the driver stages it, and the call returns once `src` may be reused.
    CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream_));
  }
}

void CudaBackend::copy_to_host(void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) {
    synchronize();
    return;
  }
  if (nbytes <= kSlotBytes) {
    const int s = next_slot();
    char* slot = pinned_ + s * kSlotBytes;
    CUDA_CHECK(cudaMemcpyAsync(slot, src, nbytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(dst, slot, static_cast<size_t>(nbytes));
  } else {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void CudaBackend::copy(void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::synchronize() {
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaStreamSynchronize(side_stream_));
}

// PAGELLM_ABLATE_OPS (cuda_backend.h): a comma-separated list of op names (Backend methods, those
// its row of core/tuning.cpp's table takes): those ops return at once and launch nothing. A benchmark's
// decode step without an op, against the whole step, is what that op costs in place: inside the
// CUDA graph, overlapped with its neighbours under programmatic launch, which timing the ops one
// by one (bench --profile) cannot show. The outputs are wrong, so it is for timing only and says so
// once, as a warning. Leaving out an op that decides what later ops read (moe_route) changes their
// work too: not a measurement.
bool ablated(std::string_view op) {
  static const std::string ops = [] {
    std::string list = tuning::words("PAGELLM_ABLATE_OPS");
    if (!list.empty())
      PAGELLM_LOG_WARN(
          "PAGELLM_ABLATE_OPS=%s: these ops launch nothing, outputs are wrong (for timing only)",
          list.c_str());
    return list;
  }();
  return !ops.empty() && tuning::has_word(ops, op);
}

void CudaBackend::advance_side(Side from, Side to, const char* misuse) {
  PAGELLM_CHECK_MSG(side_ == from, misuse);
  side_ = to;
}

void CudaBackend::swap_side() {
  std::swap(stream_, side_stream_);
  std::swap(gemm_, side_gemm_);
  std::swap(quant_slice_, side_quant_slice_);
  std::swap(fp8_matmul_, side_fp8_matmul_);
  std::swap(fp8_scratch_, side_fp8_scratch_);
}

void CudaBackend::begin_side() {
  advance_side(Side::kNone, Side::kOpen, "begin_side: a side branch is already open");
  CUDA_CHECK(cudaEventRecord(fork_event_, stream_));
  CUDA_CHECK(cudaStreamWaitEvent(side_stream_, fork_event_, 0));
  swap_side();
}

void CudaBackend::end_side() {
  advance_side(Side::kOpen, Side::kEnded, "end_side: no side branch is open");
  CUDA_CHECK(cudaEventRecord(join_event_, stream_));
  swap_side();
}

void CudaBackend::join_side() {
  advance_side(Side::kEnded, Side::kNone, "join_side: no ended side branch to join");
  CUDA_CHECK(cudaStreamWaitEvent(stream_, join_event_, 0));
}

void* CudaBackend::grow_workspace(std::unique_ptr<Buffer>& buf, int64_t nbytes, const char* op,
                                  const char* what) {
  const int64_t have = buf ? buf->nbytes() : 0;
  if (nbytes > have) {
    PAGELLM_CHECK_MSG(!capturing(stream_), (std::string(op) + ": " + what +
                                            " must grow inside a graph recording; run the same "
                                            "step directly first so it has its size")
                                               .c_str());
    synchronize();  // earlier steps may still use the old one
    buf.reset();    // bumps the allocation epoch: recordings using it are stale
    // Grow geometrically so a slowly growing step size does not reallocate every time.
    buf = must_allocate(std::max(nbytes, 2 * have), what);
  }
  return buf->data();
}

void* CudaBackend::ensure_upload_staging(int64_t nbytes) {
  if (nbytes > upload_staging_bytes_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old staging may still be read
    if (upload_staging_ != nullptr) {
      CUDA_CHECK(cudaFree(upload_staging_));
      ++*epoch_;
    }
    upload_staging_ = nullptr;
    CUDA_CHECK(cudaMalloc(&upload_staging_, nbytes));
    upload_staging_bytes_ = nbytes;
  }
  return upload_staging_;
}

void* CudaBackend::ensure_attention_workspace(int64_t nbytes) {
  if (nbytes > attn_workspace_bytes_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // earlier steps may still use the old one
    if (attn_workspace_ != nullptr) {
      CUDA_CHECK(cudaFree(attn_workspace_));
      ++*epoch_;
    }
    attn_workspace_ = nullptr;
    // Grow geometrically so a slowly lengthening context does not reallocate every step.
    const int64_t bytes = std::max(nbytes, attn_workspace_bytes_ * 2);
    CUDA_CHECK(cudaMalloc(&attn_workspace_, bytes));
    attn_workspace_bytes_ = bytes;
  }
  return attn_workspace_;
}

int32_t* CudaBackend::ensure_attention_counters(int64_t count) {
  const int64_t have = attn_counters_ ? attn_counters_->nbytes() / 4 : 0;
  if (count > have) {
    synchronize();           // earlier steps may still use the old ones
    attn_counters_.reset();  // bumps the allocation epoch: recordings using them are stale
    attn_counters_ = must_allocate(4 * std::max(count, 2 * have), "decode attention's counters");
    CUDA_CHECK(cudaMemsetAsync(attn_counters_->data(), 0, attn_counters_->nbytes(), stream_));
  }
  return static_cast<int32_t*>(attn_counters_->data());
}

void CudaBackend::preload_kernels(int64_t max_tokens) {
  gemm_->preload_kernels(max_tokens);
  side_gemm_->preload_kernels(max_tokens);
}

bool CudaBackend::background_work() {
  // While the main stream (the step's) still runs; the side branch's products join it.
  const bool main_left = gemm_->refine_plans(stream_);
  return side_gemm_->refine_plans(stream_) || main_left;
}

std::unique_ptr<OpGraph> CudaBackend::capture(const std::function<void()>& record) {
  // Thread-local mode: only this thread's capture-unsafe calls (a synchronize, an allocation) fail
  // the capture; other threads of the process are unaffected.
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  record();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (end != cudaSuccess || graph == nullptr) {
    std::fprintf(stderr, "cuda backend: graph capture failed: %s; running ops directly\n",
                 cudaGetErrorString(end));
    cudaGetLastError();  // clear the sticky capture error so later calls see a clean state
    if (graph != nullptr) cudaGraphDestroy(graph);
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable keeps what it needs
  if (inst != cudaSuccess) {
    std::fprintf(stderr, "cuda backend: graph instantiation failed: %s; running ops directly\n",
                 cudaGetErrorString(inst));
    cudaGetLastError();
    return nullptr;
  }
  // The executable goes to the device now rather than on its first launch, which would otherwise
  // add ~0.3 ms to the first decode step of each batch size (docs/PERF.md).
  CUDA_CHECK(cudaGraphUpload(exec, stream_));
  return std::make_unique<CudaGraph>(exec, stream_);
}

Result<Tensor> CudaBackend::upload_weight(const Tensor& host, DType dtype,
                                          std::unique_ptr<Buffer>& storage) {
  if (host.device != Device::kCpu)
    return invalid_argument("upload_weight: tensor " + host.shape_string() +
                            " is not in host memory");
  if (!host.is_contiguous())
    return invalid_argument("upload_weight: tensor " + host.shape_string() + " is not contiguous");
  // The 4-bit and FP8 types where they fit the device's layouts (quantized_storage says so) stay
  // quantized. FP8 weights whose rows each have one scale (per-tensor and per-channel
  // checkpoints) become F8Row, the same bytes with a faster GEMM (Fp8Matmul); those whose scales
  // change within 128 columns (none of the checkpoint schemes') go to bf16 below.
  if (kept_quantized(dtype) && quantized_storage(host.dtype, host.rows(), host.cols()) == dtype) {
    const DType kept =
        is_kept_fp8(dtype) ? fp8_kept_type(host.dtype, host.data, host.rows(), host.cols()) : dtype;
    if (kept != DType::kF32) return upload_kept(host, kept, storage);
  }
  const bool src_float = is_float_type(host.dtype) || is_quantized(host.dtype);
  // Other requests for a quantized storage type get bf16.
  const DType target = is_quantized(dtype) ? DType::kBF16 : dtype;
  if (host.dtype != target && !(src_float && is_float_type(target)))
    return invalid_argument("upload_weight: cannot convert " + std::string(dtype_name(host.dtype)) +
                            " tensor " + host.shape_string() + " to " +
                            std::string(dtype_name(target)));
  const int64_t cols = host.cols(), n_rows = host.rows();
  if (is_quantized(host.dtype) && cols % block_elems(host.dtype) != 0)
    return invalid_argument("upload_weight: quantized tensor " + host.shape_string() +
                            " has rows that are not a whole number of " +
                            std::to_string(block_elems(host.dtype)) + "-value blocks");
  PAGELLM_ASSIGN_OR_RETURN(storage, allocate_or_error(dtype_bytes(target, host.numel()),
                                                      "a weight " + host.shape_string()));
  Tensor dev = host;
  dev.data = storage->data();
  dev.dtype = target;
  dev.device = Device::kCuda;
  dev.set_contiguous_strides();
  if (host.numel() == 0) return dev;
  if (host.dtype == target) {
    CUDA_CHECK(cudaMemcpyAsync(dev.data, host.data, dtype_bytes(target, host.numel()),
                               cudaMemcpyHostToDevice, stream_));
    return dev;
  }
  // Convert on the device in chunks of whole rows through a reusable staging buffer; the copies
  // and kernels are ordered on the stream, so the next chunk's copy waits for this chunk's kernel.
  // The 5-bit and k-quant types, which no device kernel decodes, are dequantized to f32 here
  // first (a pageable source: the copy has left the host buffer when cudaMemcpyAsync returns).
  const bool host_dequant = is_quantized(host.dtype) && !device_dequantizes(host.dtype);
  const int64_t src_row_bytes = dtype_bytes(host.dtype, cols);
  const int64_t staged_row_bytes = host_dequant ? cols * 4 : src_row_bytes;
  const int64_t chunk_rows =
      std::max<int64_t>(1, kUploadChunkBytes / std::max<int64_t>(staged_row_bytes, 1));
  void* staging = ensure_upload_staging(std::min(n_rows, chunk_rows) * staged_row_bytes);
  const char* src = static_cast<const char*>(host.data);
  char* dst = static_cast<char*>(dev.data);
  std::vector<float> dequantized;
  for (int64_t r0 = 0; r0 < n_rows; r0 += chunk_rows) {
    const int64_t nr = std::min(chunk_rows, n_rows - r0);
    void* out = dst + dtype_bytes(target, r0 * cols);
    if (host_dequant) {
      dequantized.resize(nr * cols);
      ThreadPool::global().parallel_for(nr, 64, [&](int64_t b, int64_t e) {  // rows are independent
        pagellm::to_f32(host.dtype, src + (r0 + b) * src_row_bytes, dequantized.data() + b * cols,
                        (e - b) * cols);
      });
      CUDA_CHECK(cudaMemcpyAsync(staging, dequantized.data(), nr * cols * 4, cudaMemcpyHostToDevice,
                                 stream_));
      launch_convert(staging, DType::kF32, out, target, nr * cols, stream_);
      continue;
    }
    CUDA_CHECK(cudaMemcpyAsync(staging, src + r0 * src_row_bytes, nr * src_row_bytes,
                               cudaMemcpyHostToDevice, stream_));
    if (is_quantized(host.dtype)) {
      launch_dequantize(staging, host.dtype, out, target, nr, cols, stream_);
    } else {
      launch_convert(staging, host.dtype, out, target, nr * cols, stream_);
    }
  }
  return dev;
}

// --- ops ---

void CudaBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  check_on_device(table, "table");
  check_on_device(ids, "ids");
  check_on_device(out, "out");
  PAGELLM_CHECK_MSG(
      table.ndim == 2 && is_float_type(table.dtype),
      "embedding: table must be a 2-D float tensor (quantized tables are dequantized on upload)");
  PAGELLM_CHECK(ids.dtype == DType::kI32 && ids.is_contiguous());
  PAGELLM_CHECK(is_float_type(out.dtype) && out.rows() == ids.numel() &&
                out.cols() == table.cols());
  launch_embedding(rows_of(table), ids.ptr<int32_t>(), handover_, rows_of(out), stream_);
}

// The norm ops called alone let the kernel after them launch before the norm's own wait
// (launch_rms_norm's release_early): DeepSeek-V2-Lite's batch-1 decode gains 2-3% by it (its
// latent norm before RoPE, the norms before its small projections), Mixtral and the models' last
// norm nothing measurable. The norm before a Llama projection loses 1-1.5% by it, so the ops that
// run a norm and then their own projection (rms_norm_matmul, rms_norm_swiglu) never release it
// (docs/perf-history "Twenty-first round").
void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  run_rms_norm(x, w, eps, out, early_release());
}

void CudaBackend::run_rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out,
                               bool release_early) {
  if (ablated("rms_norm")) return;
  check_on_device(x, "x");
  check_on_device(w, "w");
  check_on_device(out, "out");
  PAGELLM_CHECK(is_float_type(x.dtype) && out.dtype == x.dtype && is_float_type(w.dtype));
  PAGELLM_CHECK(w.numel() == x.cols() && w.is_contiguous());
  PAGELLM_CHECK(out.rows() == x.rows() && out.cols() == x.cols());
  launch_rms_norm(rows_of(x), w.data, w.dtype, eps, rows_of(out), stream_, release_early);
}

void CudaBackend::add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                               Tensor& out) {
  if (ablated("add_rms_norm")) return;
  check_on_device(x, "x");
  check_on_device(residual, "residual");
  check_on_device(w, "w");
  check_on_device(out, "out");
  PAGELLM_CHECK(is_float_type(x.dtype) && residual.dtype == x.dtype && out.dtype == x.dtype);
  PAGELLM_CHECK(is_float_type(w.dtype) && w.numel() == x.cols() && w.is_contiguous());
  PAGELLM_CHECK(residual.rows() == x.rows() && residual.cols() == x.cols());
  PAGELLM_CHECK(out.rows() == x.rows() && out.cols() == x.cols());
  launch_add_rms_norm(rows_of(x), rows_of(residual), w.data, w.dtype, eps, rows_of(out), stream_,
                      early_release());
}

CudaBackend::MatmulOperands CudaBackend::matmul_operands(const Tensor& x, const Tensor& w,
                                                         const Tensor& bias, const Tensor& out,
                                                         const char* op) const {
  // Each message names the op; it is built only when its check fails (PAGELLM_CHECK_MSG).
  check_on_device(x, "x");
  check_on_device(w, "w");
  check_on_device(out, "out");
  PAGELLM_CHECK_MSG(x.dtype == DType::kBF16,
                    (std::string(op) + ": activations must be bf16").c_str());
  PAGELLM_CHECK_MSG(
      w.ndim == 2 && (is_float_type(w.dtype) || kept_quantized(w.dtype)),
      (std::string(op) + ": weight must be a 2-D f32/f16/bf16, 4-bit or FP8 tensor (other "
                         "quantized weights are dequantized on upload)")
          .c_str());
  PAGELLM_CHECK_MSG(out.dtype == DType::kBF16 || out.dtype == DType::kF32,
                    (std::string(op) + ": out must be bf16 or f32").c_str());
  PAGELLM_CHECK_MSG(w.size(1) == x.cols() && x.cols() > 0,
                    (std::string(op) + ": x and w disagree on K").c_str());
  PAGELLM_CHECK_MSG(out.rows() == x.rows() && out.cols() == w.size(0),
                    (std::string(op) + ": out shape").c_str());
  MatmulOperands m{rows_of(x), rows_of(w), rows_of(out)};
  if (bias.defined()) {
    check_on_device(bias, "bias");
    PAGELLM_CHECK(is_float_type(bias.dtype) && bias.numel() == w.size(0) && bias.is_contiguous());
    m.bias = bias.data;
    m.bias_dtype = bias.dtype;
  }
  return m;
}

void CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  if (ablated("matmul")) return;
  const MatmulOperands m = matmul_operands(x, w, bias, out, "matmul");
  if (w.dtype == DType::kBF16) {
    gemm_->run(m.x, m.w, m.bias, m.bias_dtype, m.out);
  } else if (kept_quantized(w.dtype)) {
    kept_matmul(m, nullptr);
  } else {
    launch_gemm_fallback(m.x, m.w, m.bias, m.bias_dtype, m.out, stream_);
  }
}

void CudaBackend::matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& scratch,
                             Tensor& out) {
  if (ablated("matmul_add")) return;
  const MatmulOperands m = matmul_operands(x, w, bias, out, "matmul_add");
  check_on_device(scratch, "scratch");
  if (w.dtype == DType::kBF16) {
    gemm_->run_add(m.x, m.w, m.bias, m.bias_dtype, m.out, rows_of(scratch));
  } else if (kept_quantized(w.dtype)) {
    kept_matmul(m, &scratch);
  } else {
    launch_gemm_fallback(m.x, m.w, m.bias, m.bias_dtype, m.out, stream_, /*accumulate=*/true);
  }
}

namespace {

// PAGELLM_GEMV_FUSIONS (a list of "swiglu" and "fold"; default "swiglu"; "none" for none) says
// which steps the GEMV takes in; the others run as their own kernels. "fold" folds the pre-norm
// weights into the projections at load (fold_norm_weight), so the GEMV normalizes with a weight of
// ones, its stream the plain product's: on the H200 (docs/perf-history, eleventh round)
// Llama-3-8B decoded 213.5-214.2 tok/s with it against 210.8-211.8 without, but the folded weights
// are rounded to bf16 once more, which put 3 of the 13 GPU golden fixtures just outside their bound
// (within 1.5x transformers' own bf16 error), so it is off: exact first. SwiGLU in the GEMV lost
// in the seventh round (203.8-205.7 against 207.5-207.9 tok/s) but streams at the plain product's
// rate since (eleventh round's bench): on by default since the twelfth round, where Llama-3-8B
// decoded 213.7-214.9 tok/s with it against 210.8-211.9 without, every GPU golden fixture passing
// with it (gate and up stay f32 until their product: one rounding fewer). A norm with its weight
// loaded in the GEMV streamed 7-13% slower (seventh and fourteenth rounds) and is gone.
struct GemvFusions {
  bool swiglu = false, fold = false;
};
const GemvFusions& gemv_fusions() {
  static const GemvFusions f = [] {
    const std::string list = tuning::words("PAGELLM_GEMV_FUSIONS");
    return GemvFusions{tuning::has_word(list, "swiglu"), tuning::has_word(list, "fold")};
  }();
  return f;
}

}  // namespace

Tensor CudaBackend::fold_norm_weight(const Tensor& g, Tensor& w) {
  if (!gemv_fusions().fold) return g;
  check_on_device(g, "norm weight");
  check_on_device(w, "w");
  PAGELLM_CHECK_MSG(
      g.dtype == DType::kF32 && g.is_contiguous() && w.ndim == 2 && w.size(1) == g.numel(),
      "fold_norm_weight: g must be f32 [K] for w [M, K]");
  if (w.dtype != DType::kBF16) return g;  // the GEMV streams bf16 weights only
  launch_scale_columns(rows_of(w), g.ptr<float>(), stream_);
  std::unique_ptr<Buffer>& ones = unit_norms_[g.numel()];
  if (ones == nullptr) {
    ones = must_allocate(g.numel() * 4, "a norm weight of ones");
    const std::vector<float> host(g.numel(), 1.0f);
    copy_from_host(ones->data(), host.data(), g.numel() * 4);
  }
  return Tensor(ones->data(), DType::kF32, {g.numel()}, Device::kCuda);
}

bool CudaBackend::is_unit_norm(const Tensor& norm_w) const {
  const auto it = unit_norms_.find(norm_w.numel());
  return it != unit_norms_.end() && it->second->data() == norm_w.data;
}

bool CudaBackend::fused_gemv(const Tensor& x, const Tensor* norm_w, float eps, const Tensor& w,
                             const Tensor& bias, const Tensor& product, GemvEpilogue epilogue,
                             Tensor& out) {
  const bool unit = norm_w != nullptr && is_unit_norm(*norm_w);
  // A fusion that is off, or a norm the GEMV does not take (only one folded into w): the caller
  // runs the steps apart, whose ops check their operands.
  if ((epilogue == GemvEpilogue::kSwiGlu && !gemv_fusions().swiglu) || (norm_w != nullptr && !unit))
    return false;
  const MatmulOperands m = matmul_operands(x, w, bias, product, "fused projection");
  check_on_device(out, "out");
  GemvFusion f;
  f.eps = eps;
  f.epilogue = epilogue;
  f.unit_norm = unit;
  const RowView ov = rows_of(out);
  if (w.dtype != DType::kBF16 || !gemv_fusion_supported(m.x, m.w, ov, f) ||
      !gemm_->uses_gemv(m.x, m.w, m.bias, m.bias_dtype, m.out))
    return false;
  launch_gemv(m.x, m.w, m.bias, m.bias_dtype, ov, stream_, f);
  return true;
}

void CudaBackend::matmul_swiglu(const Tensor& x, const Tensor& w, const Tensor& bias,
                                Tensor& gate_up, Tensor& out) {
  if (ablated("matmul_swiglu")) return;
  if (fused_gemv(x, nullptr, 0.0f, w, bias, gate_up, GemvEpilogue::kSwiGlu, out)) return;
  Backend::matmul_swiglu(x, w, bias, gate_up, out);
}

void CudaBackend::rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                                  const Tensor& bias, Tensor& h, Tensor& out) {
  if (ablated("rms_norm_matmul")) return;
  if (fused_gemv(x, &norm_w, eps, w, bias, out, GemvEpilogue::kStore, out)) return;
  // Apart: the norm, which lets the projection launch only after its wait (see rms_norm).
  run_rms_norm(x, norm_w, eps, h, false);
  matmul(h, w, bias, out);
}

void CudaBackend::rms_norm_swiglu(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                                  const Tensor& bias, Tensor& h, Tensor& gate_up, Tensor& out) {
  if (ablated("rms_norm_swiglu")) return;
  if (fused_gemv(x, &norm_w, eps, w, bias, gate_up, GemvEpilogue::kSwiGlu, out)) return;
  // The folded norm in the GEMV and SiLU apart, when SwiGLU's fusion is off.
  if (fused_gemv(x, &norm_w, eps, w, bias, gate_up, GemvEpilogue::kStore, gate_up)) {
    const int64_t f = out.cols();
    silu_mul(gate_up.slice_cols(0, f), gate_up.slice_cols(f, 2 * f), out);
    return;
  }
  run_rms_norm(x, norm_w, eps, h, false);  // as in rms_norm_matmul
  matmul_swiglu(h, w, bias, gate_up, out);
}

namespace {

// Whether projection_chain runs one-row chains as one streamed launch. On by default;
// PAGELLM_STREAM_CHAIN=0 runs the links one by one (to measure it).
bool stream_chain_on() {
  static const bool on = tuning::on("PAGELLM_STREAM_CHAIN");
  return on;
}

// A 1-row activation view with contiguous bf16 elements, 16-byte aligned: how the chain reads
// and writes its vectors.
bool chain_vector(const Tensor& t, int64_t cols) {
  return t.dtype == DType::kBF16 && t.rows() == 1 && t.cols() == cols && t.is_contiguous() &&
         reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

// The chain's phase for one link, or false when the link does not fit the streamed chain (bf16
// weights without a bias, one-row vectors, an f32 norm weight).
bool stream_phase_of(const Backend::ProjectionLink& k, StreamPhase& ph) {
  using Kind = Backend::ProjectionLink::Kind;
  const Tensor& w = *k.w;
  if (w.dtype != DType::kBF16 || w.ndim != 2 || !w.is_contiguous() || k.bias->defined() ||
      w.device != Device::kCuda || w.size(0) >= (int64_t{1} << 30))
    return false;
  const int64_t m = w.size(0), kd = w.size(1);
  if (!chain_vector(*k.x, kd) || !chain_vector(*k.out, k.kind == Kind::kNormSwiGlu ? m / 2 : m))
    return false;
  if (k.kind != Kind::kMatmulAdd) {
    const Tensor& g = *k.norm_w;
    if (g.dtype != DType::kF32 || !g.is_contiguous() || g.numel() != kd ||
        reinterpret_cast<uintptr_t>(g.data) % 16 != 0)
      return false;
  }
  ph.w = w.data;
  ph.m = static_cast<int>(m);
  ph.k = static_cast<int>(kd);
  ph.x = k.x->data;
  ph.norm_w = k.kind == Kind::kMatmulAdd ? nullptr : static_cast<const float*>(k.norm_w->data);
  ph.out = k.out->data;
  ph.epilogue = k.kind == Kind::kMatmulAdd    ? GemvEpilogue::kAdd
                : k.kind == Kind::kNormSwiGlu ? GemvEpilogue::kSwiGlu
                                              : GemvEpilogue::kStore;
  return gemv_stream_chain_supported(ph);
}

// PAGELLM_CHAIN_TIMES=1: the chain's launches time their phases (StreamChainTimes) and the
// backend logs where they went when it is destroyed; a diagnostic (its kernel build takes a few
// stamps and atomics a phase), off by default.
bool chain_times_on() {
  static const bool on = tuning::on("PAGELLM_CHAIN_TIMES");
  return on;
}

std::string describe_phase(const StreamPhase& ph) {
  std::string d = ph.norm_w != nullptr ? "norm + " : "";
  d += std::to_string(ph.m) + " x " + std::to_string(ph.k);
  if (ph.epilogue == GemvEpilogue::kSwiGlu) d += " SwiGLU";
  if (ph.epilogue == GemvEpilogue::kAdd) d += " + residual";
  return d;
}

}  // namespace

void CudaBackend::log_chain_times() {
  StreamChainTimes t;
  if (cudaMemcpy(&t, chain_times_->data(), sizeof t, cudaMemcpyDeviceToHost) != cudaSuccess) return;
  const double blocks = gemv_stream_chain_blocks();
  for (int n = 1; n <= kMaxStreamPhases; ++n) {
    if (t.launches[n] == 0) continue;
    const double per = 1e3 * static_cast<double>(t.launches[n]) * blocks;  // ns -> us a block
    double total = 0.0;
    for (int p = 0; p < n; ++p) total += (t.wait[n][p] + t.work[n][p]) / per;
    PAGELLM_LOG_INFO("stream chain times: %llu launches of %d phases, %.2f us a block each",
                     t.launches[n], n, total);
    for (int p = 0; p < n; ++p) {
      const std::vector<std::string>& names = chain_phase_names_[n];
      PAGELLM_LOG_INFO("  phase %d (%s): wait %.2f us (most %.2f), work %.2f us (most %.2f)", p,
                       p < static_cast<int>(names.size()) ? names[p].c_str() : "?",
                       t.wait[n][p] / per, t.wait_max[n][p] / 1e3, t.work[n][p] / per,
                       t.work_max[n][p] / 1e3);
    }
  }
}

void CudaBackend::projection_chain(const std::vector<ProjectionLink>& links) {
  if (ablated("projection_chain")) return;
  StreamChain chain;
  // The launch normalizes with one eps: every norm of the chain must have it.
  float eps = 0.0f;
  bool have_eps = false, fits = stream_chain_on() && !links.empty() &&
                                links.size() <= static_cast<size_t>(kMaxStreamPhases);
  for (const ProjectionLink& k : links) {
    if (!fits) break;
    fits = stream_phase_of(k, chain.phase[chain.n_phases++]);
    if (fits && k.kind != ProjectionLink::Kind::kMatmulAdd) {
      fits = !have_eps || k.eps == eps;
      eps = k.eps;
      have_eps = true;
    }
  }
  if (!fits) {
    Backend::projection_chain(links);
    return;
  }
  if (chain_counter_ == nullptr) {
    chain_counter_ = must_allocate(sizeof(unsigned), "the projection chain's counter");
    CUDA_CHECK(cudaMemsetAsync(chain_counter_->data(), 0, sizeof(unsigned), stream_));
  }
  StreamChainTimes* times = nullptr;
  if (chain_times_on()) {
    if (chain_times_ == nullptr) {
      chain_times_ = must_allocate(sizeof(StreamChainTimes), "the projection chain's times");
      CUDA_CHECK(cudaMemsetAsync(chain_times_->data(), 0, sizeof(StreamChainTimes), stream_));
    }
    std::vector<std::string>& names = chain_phase_names_[chain.n_phases];
    if (names.empty())
      for (int p = 0; p < chain.n_phases; ++p) names.push_back(describe_phase(chain.phase[p]));
    times = static_cast<StreamChainTimes*>(chain_times_->data());
  }
  launch_gemv_stream_chain(chain, static_cast<unsigned*>(chain_counter_->data()), eps, stream_,
                           times);
}

void CudaBackend::batched_matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  if (ablated("batched_matmul")) return;
  check_on_device(x, "x");
  check_on_device(w, "w");
  check_on_device(out, "out");
  PAGELLM_CHECK_MSG(x.ndim == 3 && w.ndim == 3 && out.ndim == 3,
                    "batched_matmul: x, w and out must be 3-D [B, rows, cols]");
  PAGELLM_CHECK_MSG(x.dtype == DType::kBF16, "batched_matmul: activations must be bf16");
  PAGELLM_CHECK_MSG(is_float_type(w.dtype), "batched_matmul: w must be f32, f16 or bf16");
  PAGELLM_CHECK_MSG(out.dtype == DType::kBF16 || out.dtype == DType::kF32,
                    "batched_matmul: out must be bf16 or f32");
  const int64_t batch = x.size(0), n = x.size(1), k_dim = x.size(2), m_dim = w.size(1);
  PAGELLM_CHECK_MSG(w.size(0) == batch && out.size(0) == batch,
                    "batched_matmul: x, w and out disagree on the batch count");
  PAGELLM_CHECK_MSG(w.size(2) == k_dim && k_dim > 0, "batched_matmul: x and w disagree on K");
  PAGELLM_CHECK_MSG(out.size(1) == n && out.size(2) == m_dim, "batched_matmul: out shape");
  PAGELLM_CHECK_MSG(x.stride[0] >= 0 && w.stride[0] >= 0 && out.stride[0] >= 0,
                    "batched_matmul: negative batch stride");
  if (batch == 0 || n == 0 || m_dim == 0) return;
  // Entry 0 of each operand as a row view; a single row's stride is irrelevant, but cuBLASLt
  // wants a leading dimension of at least the row length.
  const auto entry0 = [](const Tensor& t) {
    return RowView{t.data, t.dtype, t.size(1), t.size(2),
                   t.size(1) == 1 ? std::max(t.stride[1], t.size(2)) : t.stride[1]};
  };
  const RowView xv = entry0(x), wv = entry0(w), ov = entry0(out);
  if (w.dtype == DType::kBF16) {
    gemm_->run_batched(xv, x.stride[0], wv, w.stride[0], ov, out.stride[0], batch);
    return;
  }
  const auto entry = [](RowView v, const Tensor& t, int64_t b) {
    v.data = static_cast<char*>(t.data) + dtype_bytes(t.dtype, b * t.stride[0]);
    return v;
  };
  for (int64_t b = 0; b < batch; ++b)
    launch_gemm_fallback(entry(xv, x, b), entry(wv, w, b), nullptr, DType::kF32, entry(ov, out, b),
                         stream_);
}

void CudaBackend::rope(Tensor& x, const Tensor& cos_sin, bool interleaved) {
  if (ablated("rope")) return;
  check_on_device(x, "x");
  check_on_device(cos_sin, "cos_sin");
  PAGELLM_CHECK_MSG(x.dtype == DType::kBF16, "rope: x must be bf16");
  PAGELLM_CHECK(cos_sin.dtype == DType::kF32 && cos_sin.ndim == 2 && cos_sin.size(0) == x.size(0));
  const int64_t rd = cos_sin.cols();
  PAGELLM_CHECK_MSG(rd % 2 == 0 && rd <= x.size(-1),
                    "rope: rotary_dim must be even and <= head_dim");
  launch_rope(heads_of(x), cos_sin.ptr<float>(), cos_sin.row_stride(), rd, interleaved, stream_);
}

void CudaBackend::rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos_sin,
                                bool interleaved, const Tensor& slot_mapping, Tensor& k_cache,
                                Tensor& v_cache, float k_scale, float v_scale) {
  (void)k_scale, (void)v_scale;  // bf16 caches only (supports_fp8_kv_cache() is false)
  if (ablated("rope_store_kv")) return;
  for (const auto& [t, what] : {std::pair<const Tensor*, const char*>{&q, "q"},
                                {&k, "k"},
                                {&v, "v"},
                                {&cos_sin, "cos_sin"},
                                {&slot_mapping, "slot_mapping"},
                                {&k_cache, "k_cache"},
                                {&v_cache, "v_cache"}})
    check_on_device(*t, what);
  PAGELLM_CHECK_MSG(q.ndim == 3 && k.ndim == 3 && v.ndim == 3,
                    "rope_store_kv: q, k, v must be [n, heads, dim]");
  PAGELLM_CHECK(q.dtype == DType::kBF16 && k.dtype == DType::kBF16 && v.dtype == DType::kBF16);
  PAGELLM_CHECK(k_cache.dtype == DType::kBF16 && v_cache.dtype == DType::kBF16);
  const int64_t n = q.size(0);
  PAGELLM_CHECK(k.size(0) == n && v.size(0) == n && slot_mapping.numel() == n);
  PAGELLM_CHECK(slot_mapping.dtype == DType::kI32 && slot_mapping.is_contiguous());
  PAGELLM_CHECK(cos_sin.dtype == DType::kF32 && cos_sin.ndim == 2 && cos_sin.size(0) == n);
  const int64_t rd = cos_sin.cols();
  // q and k may differ in width (DeepSeek: q is q_pe | q_nope, k the latent row k_pe | c_kv); the
  // rotation touches the leading rotary_dim dims of each.
  PAGELLM_CHECK_MSG(rd % 2 == 0 && rd <= q.size(2) && rd <= k.size(2),
                    "rope_store_kv: rotary_dim must be even and <= the head_dim of q and of k");
  const CacheView kc = cache_of(k_cache), vc = cache_of(v_cache);
  PAGELLM_CHECK_MSG(kc.heads == k.size(1) && kc.dim == k.size(2), "rope_store_kv: k_cache shape");
  PAGELLM_CHECK_MSG(vc.heads == v.size(1) && vc.dim == v.size(2), "rope_store_kv: v_cache shape");
  PAGELLM_CHECK_MSG(vc.n_blocks == kc.n_blocks && vc.block_size == kc.block_size,
                    "rope_store_kv: k and v caches disagree on blocks");
  launch_rope_store_kv(heads_of(q), heads_of(k), heads_of(v), cos_sin.ptr<float>(),
                       cos_sin.row_stride(), rd, interleaved, slot_mapping.ptr<int32_t>(), kc, vc,
                       stream_);
}

AttentionArgs CudaBackend::attention_args(const Tensor& q, const Tensor& k_cache,
                                          const Tensor& v_cache, const AttentionMeta& meta,
                                          const AttentionParams& params, const Tensor& out) const {
  for (const auto& [t, what] : {std::pair<const Tensor*, const char*>{&q, "q"},
                                {&k_cache, "k_cache"},
                                {&v_cache, "v_cache"},
                                {&out, "out"},
                                {&meta.cu_seqlens_q, "cu_seqlens_q"},
                                {&meta.seq_lens_kv, "seq_lens_kv"},
                                {&meta.block_tables, "block_tables"}})
    check_on_device(*t, what);
  PAGELLM_CHECK(q.ndim == 3 && out.ndim == 3 && q.dtype == DType::kBF16 &&
                out.dtype == DType::kBF16);
  PAGELLM_CHECK(k_cache.dtype == DType::kBF16 && v_cache.dtype == DType::kBF16);
  const CacheView kc = cache_of(k_cache), vc = cache_of(v_cache);
  PAGELLM_CHECK_MSG(kc.dim == q.size(2), "attention: q and k_cache head_dim differ");
  PAGELLM_CHECK_MSG(out.size(0) == q.size(0) && out.size(1) == q.size(1) && out.size(2) == vc.dim,
                    "attention: out must be [n, Hq, Dv]");
  PAGELLM_CHECK_MSG(kc.block_size == meta.block_size && vc.block_size == meta.block_size,
                    "attention: cache block size differs from meta.block_size");
  PAGELLM_CHECK(meta.cu_seqlens_q.dtype == DType::kI32 &&
                meta.cu_seqlens_q.numel() == meta.n_seqs + 1);
  PAGELLM_CHECK(meta.seq_lens_kv.dtype == DType::kI32 && meta.seq_lens_kv.numel() == meta.n_seqs);
  PAGELLM_CHECK(meta.block_tables.dtype == DType::kI32 && meta.block_tables.size(0) >= meta.n_seqs);
  // The launch shapes come from these host-side bounds: zero with queries present would skip work.
  PAGELLM_CHECK_MSG(
      q.size(0) == 0 || (meta.max_seqlen_q > 0 && meta.max_seqlen_kv >= meta.max_seqlen_q),
      "attention: meta.max_seqlen_q / max_seqlen_kv not set");
  // The decode kernel reads K, V and q as bf16 pairs: even dims and strides keep them 4-byte
  // aligned.
  const auto even = [](int64_t v) { return v % 2 == 0; };
  PAGELLM_CHECK_MSG(even(kc.dim) && even(vc.dim) && even(q.stride[0]) && even(q.stride[1]) &&
                        even(kc.stride_block) && even(kc.stride_tok) && even(kc.stride_head) &&
                        even(vc.stride_block) && even(vc.stride_tok) && even(vc.stride_head) &&
                        reinterpret_cast<uintptr_t>(k_cache.data) % 4 == 0 &&
                        reinterpret_cast<uintptr_t>(v_cache.data) % 4 == 0 &&
                        reinterpret_cast<uintptr_t>(q.data) % 4 == 0,
                    "attention: head dims, strides and base addresses must be even (bf16 pairs)");
  AttentionArgs a;
  a.q = q.data;
  a.q_stride_tok = q.stride[0];
  a.q_stride_head = q.stride[1];
  a.out = out.data;
  a.o_stride_tok = out.stride[0];
  a.o_stride_head = out.stride[1];
  a.k_cache = kc;
  a.v_cache = vc;
  a.cu_seqlens_q = meta.cu_seqlens_q.ptr<int32_t>();
  a.seq_lens_kv = meta.seq_lens_kv.ptr<int32_t>();
  a.block_tables = meta.block_tables.ptr<int32_t>();
  a.block_table_ld =
      meta.block_tables.ndim == 1 ? meta.block_tables.size(0) : meta.block_tables.row_stride();
  a.n_seqs = meta.n_seqs;
  a.hq = static_cast<int32_t>(q.size(1));
  a.hkv = static_cast<int32_t>(kc.heads);
  a.head_dim = static_cast<int32_t>(kc.dim);
  a.head_dim_v = static_cast<int32_t>(vc.dim);
  a.block_size = meta.block_size;
  a.max_seqlen_q = meta.max_seqlen_q;
  a.max_seqlen_kv = meta.max_seqlen_kv;
  a.scale = params.scale;
  a.window = params.window;
  a.softcap = params.softcap;
  PAGELLM_CHECK_MSG(a.hkv > 0 && a.hq % a.hkv == 0, "attention: Hq must be a multiple of Hkv");
  if (attention_mla_wanted(a))  // attention_mla.cu writes bf16 pairs
    PAGELLM_CHECK_MSG(even(out.stride[0]) && even(out.stride[1]) &&
                          reinterpret_cast<uintptr_t>(out.data) % 4 == 0,
                      "attention: out strides and base address must be even (bf16 pairs)");
  else
    PAGELLM_CHECK_MSG(std::max(a.head_dim, a.head_dim_v) <= 256, "attention: head_dim above 256");
  return a;
}

void CudaBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                            const AttentionMeta& meta, const AttentionParams& params, Tensor& out) {
  if (ablated("attention")) return;
  if (meta.n_seqs == 0) return;
  const AttentionArgs a = attention_args(q, k_cache, v_cache, meta, params, out);
  if (attention_mla_wanted(a)) {
    // A latent cache (V a column view of the K rows, MLA) or head dims above 256: the kernel of
    // attention_mla.cu.
    run_attention_mla(a, q.size(0), nullptr);
    return;
  }
  const int64_t ws_bytes = attention_workspace_bytes(a, n_sms_);
  void* ws = ws_bytes > 0 ? ensure_attention_workspace(ws_bytes) : nullptr;
  const int64_t n_counters = attention_counters(a, n_sms_);
  int32_t* counters = n_counters > 0 ? ensure_attention_counters(n_counters) : nullptr;
  launch_attention(a, ws, counters, n_sms_, stream_);
}

void CudaBackend::run_attention_mla(const AttentionArgs& a, int64_t n_tokens,
                                    const MlaProjection* proj) {
  const int64_t ws_bytes = attention_mla_workspace_bytes(a, n_tokens, n_sms_);
  void* ws = ws_bytes > 0 ? ensure_attention_workspace(ws_bytes) : nullptr;
  launch_attention_mla(a, n_tokens, ws, n_sms_, stream_, proj);
}

void CudaBackend::attention_project(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                    const AttentionMeta& meta, const AttentionParams& params,
                                    const Tensor& w, Tensor& attn, Tensor& out) {
  // Fused where the latent kernel splits the context (small decode steps): the merge of the
  // splits applies w. Leaving out either op (PAGELLM_ABLATE_OPS) runs them apart, so each can
  // still be measured alone.
  const bool fusable_types = w.dtype == DType::kBF16 && out.dtype == DType::kBF16 && w.ndim == 3 &&
                             out.ndim == 3 && attn.ndim == 3;
  if (fusable_types && meta.n_seqs > 0 && !ablated("attention") && !ablated("batched_matmul")) {
    check_on_device(w, "w");
    check_on_device(out, "out");
    const AttentionArgs a = attention_args(q, k_cache, v_cache, meta, params, attn);
    PAGELLM_CHECK_MSG(w.size(0) == a.hq && w.size(2) == a.head_dim_v && out.size(0) == q.size(0) &&
                          out.size(1) == a.hq && out.size(2) == w.size(1),
                      "attention_project: w must be [Hq, M, Dv] and out [n, Hq, M]");
    MlaProjection p;
    p.w = w.data;
    p.w_stride_head = w.stride[0];
    p.w_stride_row = w.stride[1];
    p.out = out.data;
    p.o_stride_tok = out.stride[0];
    p.o_stride_head = out.stride[1];
    p.m = static_cast<int32_t>(w.size(1));
    if (w.size(1) <= INT32_MAX && attention_mla_projection_fusable(a, q.size(0), n_sms_, p)) {
      run_attention_mla(a, q.size(0), &p);
      return;
    }
  }
  Backend::attention_project(q, k_cache, v_cache, meta, params, w, attn, out);
}

void CudaBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  if (ablated("silu_mul")) return;
  check_on_device(gate, "gate");
  check_on_device(up, "up");
  check_on_device(out, "out");
  PAGELLM_CHECK(is_float_type(out.dtype) && gate.dtype == out.dtype && up.dtype == out.dtype);
  PAGELLM_CHECK(gate.rows() == out.rows() && gate.cols() == out.cols());
  PAGELLM_CHECK(up.rows() == out.rows() && up.cols() == out.cols());
  launch_silu_mul(rows_of(gate), rows_of(up), rows_of(out), stream_);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_on_device(a, "a");
  check_on_device(b, "b");
  check_on_device(out, "out");
  PAGELLM_CHECK(is_float_type(out.dtype) && a.dtype == out.dtype && b.dtype == out.dtype);
  PAGELLM_CHECK(same_shape(a, out) && same_shape(b, out));
  launch_add(rows_of(a), rows_of(b), rows_of(out), stream_);
}

void CudaBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  check_on_device(x, "x");
  check_on_device(rows, "rows");
  check_on_device(out, "out");
  PAGELLM_CHECK(is_float_type(x.dtype) && out.dtype == x.dtype);
  PAGELLM_CHECK(rows.dtype == DType::kI32 && rows.is_contiguous());
  PAGELLM_CHECK(out.rows() == rows.numel() && out.cols() == x.cols());
  launch_gather_rows(rows_of(x), rows.ptr<int32_t>(), rows_of(out), stream_);
}

void CudaBackend::to_f32(const Tensor& x, Tensor& out) {
  check_on_device(x, "x");
  check_on_device(out, "out");
  PAGELLM_CHECK(is_float_type(x.dtype) && out.dtype == DType::kF32);
  PAGELLM_CHECK(out.rows() == x.rows() && out.cols() == x.cols());
  launch_to_f32(rows_of(x), rows_of(out), stream_);
}

void CudaBackend::fill_random(Tensor& t, uint64_t seed, float lo, float hi) {
  check_on_device(t, "t");
  if (kept_quantized(t.dtype)) return fill_random_kept(t, seed, lo, hi);
  PAGELLM_CHECK(is_float_type(t.dtype) && t.is_contiguous());
  launch_fill_random(t.data, t.dtype, t.numel(), seed, lo, hi, stream_);
}

void CudaBackend::sample(const Tensor& logits, const DeviceSampleInputs& in,
                         DeviceSampleResult* out) {
  sample_with_group(logits, in, out, 0);
}

void CudaBackend::sample_with_group(const Tensor& logits, const DeviceSampleInputs& in,
                                    DeviceSampleResult* out, int group) {
  if (in.n_rows <= 0) return;
  sample_results(enqueue_sample(logits, in, group), out);
}

uint64_t CudaBackend::sample_async(const Tensor& logits, const DeviceSampleInputs& in) {
  return enqueue_sample(logits, in, 0);
}

CudaBackend::SampleSlot& CudaBackend::sample_slot(uint64_t ticket) {
  SampleSlot& slot = sample_slots_[ticket % kSampleSlots];
  PAGELLM_CHECK_MSG(ticket != 0 && slot.ticket == ticket,
                    "sampled results asked for after their slot was reused");
  return slot;
}

uint64_t CudaBackend::enqueue_sample(const Tensor& logits, const DeviceSampleInputs& in,
                                     int group) {
  const DeviceSampleRow* rows = in.rows;
  const DeviceSampleEdit* edits = in.edits;
  const int32_t n_rows = in.n_rows, n_edits = in.n_edits;
  check_on_device(logits, "logits");
  PAGELLM_CHECK_MSG(
      logits.ndim == 2 && (logits.dtype == DType::kBF16 || logits.dtype == DType::kF32),
      "sample: logits must be a [n, vocab] bf16 or f32 tensor");
  const int64_t n_logit_rows = logits.size(0), vocab = logits.size(1);
  PAGELLM_CHECK_MSG(vocab > 0 && vocab < INT32_MAX, "sample: vocabulary size out of range");
  PAGELLM_CHECK(n_rows >= 0 && n_edits >= 0 && (n_edits == 0 || edits != nullptr));
  PAGELLM_CHECK(in.n_mask_words >= 0 && (in.n_mask_words == 0 || in.masks != nullptr));
  const int64_t mask_words = (vocab + 31) / 32;
  // Rows that only take the argmax (greedy, as a greedy request or a benchmark samples): the
  // lean kernel, whose launch carries up to kGreedyParamRows rows' logits rows itself, so the
  // call uploads nothing and the step waits for no copy (the general kernel took 27.7 us at
  // batch 1 against 23.4: docs/perf-history, twenty-fifth round).
  bool lean = group == 0;
  // The kernel trusts these: an edit list out of order or out of range would read out of bounds.
  for (int32_t i = 0; i < n_rows; ++i) {
    const DeviceSampleRow& r = rows[i];
    lean = lean && greedy_row_is_lean(r);
    PAGELLM_CHECK_MSG(r.logits_row >= 0 && r.logits_row < n_logit_rows,
                      "sample: a row reads a logits row that does not exist");
    PAGELLM_CHECK_MSG(0 <= r.edit_begin && r.edit_begin <= r.edit_end && r.edit_end <= n_edits,
                      "sample: a row's edit range is outside the edit list");
    PAGELLM_CHECK_MSG(r.n_logprobs >= -1 && r.n_logprobs <= kDeviceSampleMaxTop,
                      "sample: n_logprobs must be in [-1, 20]");
    PAGELLM_CHECK_MSG(
        r.mask_word == -1 || (r.mask_word >= 0 && r.mask_word + mask_words <= in.n_mask_words),
        "sample: a row's grammar mask is outside the mask list");
    for (int32_t e = r.edit_begin; e < r.edit_end; ++e) {
      PAGELLM_CHECK_MSG(edits[e].token >= 0 && edits[e].token < vocab,
                        "sample: an edit's token is outside the vocabulary");
      PAGELLM_CHECK_MSG(e == r.edit_begin || edits[e - 1].token < edits[e].token,
                        "sample: a row's edits must be sorted by token, one per token");
    }
  }
  const uint64_t ticket = ++sample_tickets_;
  SampleSlot& slot = sample_slots_[ticket % kSampleSlots];
  // The slot's previous call (kSampleSlots ago) has been read, or its results are dropped: once
  // its copies are done, the areas are free to refill.
  if (slot.ticket != 0) CUDA_CHECK(cudaEventSynchronize(slot.done));
  slot.ticket = ticket;
  slot.n_rows = n_rows;
  if (n_rows == 0) {
    CUDA_CHECK(cudaEventRecord(slot.done, sample_stream_));
    return ticket;
  }
  auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t rows_bytes = aligned(int64_t{n_rows} * sizeof(DeviceSampleRow));
  const int64_t edits_bytes = aligned(int64_t{n_edits} * sizeof(DeviceSampleEdit));
  const int64_t masks_bytes = aligned(in.n_mask_words * int64_t{sizeof(uint32_t)});
  const int64_t results_bytes = int64_t{n_rows} * sizeof(DeviceSampleResult);
  const int64_t need = rows_bytes + edits_bytes + masks_bytes + results_bytes;
  if (need > slot.bytes) {
    // A step may still read the device area (take_sampled_tokens on the main stream).
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (slot.host != nullptr) CUDA_CHECK(cudaFreeHost(slot.host));
    if (slot.dev != nullptr) CUDA_CHECK(cudaFree(slot.dev));
    slot.host = nullptr;
    slot.dev = nullptr;
    const int64_t bytes = std::max(need, 2 * slot.bytes);
    CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&slot.host), bytes));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&slot.dev), bytes));
    slot.bytes = bytes;
  }
  slot.edits_offset = rows_bytes;
  slot.masks_offset = rows_bytes + edits_bytes;
  slot.results_offset = rows_bytes + edits_bytes + masks_bytes;
  auto* results = reinterpret_cast<DeviceSampleResult*>(slot.dev + slot.results_offset);
  int32_t* handover = n_rows <= kHandoverRows ? handover_ : nullptr;
  handover_ticket_ = handover != nullptr ? ticket : 0;
  if (lean) {
    launch_greedy_rows(logits, vocab, rows, n_rows, slot, results, handover);
  } else {
    upload_sample_rows(slot, in);
    launch_sample_rows(logits, vocab, slot, results, n_rows, handover, group);
  }
  CUDA_CHECK(cudaEventRecord(slot.sampled, stream_));
  CUDA_CHECK(cudaStreamWaitEvent(sample_stream_, slot.sampled, 0));
  CUDA_CHECK(cudaMemcpyAsync(slot.host + slot.results_offset, results, results_bytes,
                             cudaMemcpyDeviceToHost, sample_stream_));
  CUDA_CHECK(cudaEventRecord(slot.done, sample_stream_));
  return ticket;
}

void CudaBackend::upload_sample_rows(const SampleSlot& slot, const DeviceSampleInputs& in) {
  std::memcpy(slot.host, in.rows, in.n_rows * sizeof(DeviceSampleRow));
  int64_t bytes = in.n_rows * sizeof(DeviceSampleRow);
  if (in.n_edits > 0) {
    std::memcpy(slot.host + slot.edits_offset, in.edits, in.n_edits * sizeof(DeviceSampleEdit));
    bytes = slot.edits_offset + in.n_edits * sizeof(DeviceSampleEdit);
  }
  if (in.n_mask_words > 0) {
    std::memcpy(slot.host + slot.masks_offset, in.masks, in.n_mask_words * sizeof(uint32_t));
    bytes = slot.masks_offset + in.n_mask_words * sizeof(uint32_t);
  }
  CUDA_CHECK(cudaMemcpyAsync(slot.dev, slot.host, bytes, cudaMemcpyHostToDevice, sample_stream_));
  CUDA_CHECK(cudaEventRecord(slot.uploaded, sample_stream_));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, slot.uploaded, 0));
}

void CudaBackend::launch_sample_rows(const Tensor& logits, int64_t vocab, const SampleSlot& slot,
                                     DeviceSampleResult* results, int32_t n_rows, int32_t* handover,
                                     int group) {
  SampleLaunch l;
  l.logits = logits.data;
  l.dtype = logits.dtype;
  l.ld = logits.row_stride();
  l.vocab = static_cast<int32_t>(vocab);
  l.rows = reinterpret_cast<const DeviceSampleRow*>(slot.dev);
  l.n_rows = n_rows;
  l.edits = reinterpret_cast<const DeviceSampleEdit*>(slot.dev + slot.edits_offset);
  l.masks = reinterpret_cast<const uint32_t*>(slot.dev + slot.masks_offset);
  l.results = results;
  l.n_sms = n_sms_;
  l.cluster_ok = cluster_ok_;
  l.force_group = group;
  l.handover = handover;
  launch_sample(l, stream_);
}

void CudaBackend::launch_greedy_rows(const Tensor& logits, int64_t vocab,
                                     const DeviceSampleRow* rows, int32_t n_rows,
                                     const SampleSlot& slot, DeviceSampleResult* results,
                                     int32_t* handover) {
  if (n_rows > greedy_rows_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // an earlier call may still use the old one
    if (greedy_scratch_ != nullptr) CUDA_CHECK(cudaFree(greedy_scratch_));
    greedy_scratch_ = nullptr;
    greedy_rows_ = 0;
    const int32_t cap = std::max(n_rows, kGreedyParamRows);
    CUDA_CHECK(cudaMalloc(&greedy_scratch_, greedy_sample_scratch_bytes(cap)));
    CUDA_CHECK(cudaMemsetAsync(greedy_scratch_, 0, greedy_sample_scratch_bytes(cap), stream_));
    greedy_rows_ = cap;
  }
  GreedySampleLaunch g;
  g.logits = logits.data;
  g.dtype = logits.dtype;
  g.ld = logits.row_stride();
  g.vocab = static_cast<int32_t>(vocab);
  g.n_rows = n_rows;
  if (n_rows <= kGreedyParamRows) {
    g.host_rows = rows;
  } else {
    upload_sample_rows(slot, {rows, n_rows, nullptr, 0, nullptr, 0});
    g.rows = reinterpret_cast<const DeviceSampleRow*>(slot.dev);
  }
  g.results = results;
  g.handover = handover;
  g.scratch = greedy_scratch_;
  g.scratch_rows = greedy_rows_;
  g.n_sms = n_sms_;
  launch_greedy_sample(g, stream_);
}

void CudaBackend::sample_results(uint64_t ticket, DeviceSampleResult* out) {
  SampleSlot& slot = sample_slot(ticket);
  CUDA_CHECK(cudaEventSynchronize(slot.done));
  if (slot.n_rows > 0)
    std::memcpy(static_cast<void*>(out), slot.host + slot.results_offset,
                int64_t{slot.n_rows} * sizeof(DeviceSampleResult));
}

void CudaBackend::take_sampled_tokens(Tensor& tokens, uint64_t ticket) {
  check_on_device(tokens, "tokens");
  PAGELLM_CHECK_MSG(tokens.dtype == DType::kI32 && tokens.ndim == 1,
                    "take_sampled_tokens: tokens must be an i32 vector");
  const SampleSlot& slot = sample_slot(ticket);
  // The last call's tokens are in the hand-over area, where the step's embedding takes them
  // (launch_embedding): nothing to queue.
  if (ticket == handover_ticket_) return;
  // Queued after the sampling kernel on the same stream: its results are there.
  launch_take_sampled_tokens(static_cast<int32_t*>(tokens.data), tokens.numel(),
                             reinterpret_cast<const DeviceSampleResult*>(
                                 slot.n_rows > 0 ? slot.dev + slot.results_offset : nullptr),
                             slot.n_rows, stream_);
}

}  // namespace cuda

Result<std::unique_ptr<Backend>> make_cuda_backend(int device_index) {
  auto r = cuda::CudaBackend::create(device_index);
  if (!r.ok()) return r.status();
  return std::unique_ptr<Backend>(std::move(r).value());
}

}  // namespace pagellm
