// conv_gemm's halo kernels at stride 1 (conv_gemm_halo_launch.cuh says why a file a stride).
#include "conv_gemm_halo_launch.cuh"

namespace epilog::cuda::conv_gemm_detail {

template void dispatch_halo<1>(const GemmLaunch& l, const HaloArgs& a, Stream stream);
template void launch_chain<1>(const HaloArgs& a, int m, bool wide, Stream stream);

}  // namespace epilog::cuda::conv_gemm_detail
