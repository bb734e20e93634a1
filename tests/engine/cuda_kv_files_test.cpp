// Prompt cache files and the SSD tier on CUDA (the cases: kv_files_cases.h); SKIPPED without a GPU.
#define KILN_KV_DEVICE "cuda"
#define KILN_KV_SUITE CudaKvFiles
#include "kv_files_cases.h"
