// Prompt cache files and the SSD tier on the CPU (the cases: kv_files_cases.h).
#define KILN_KV_DEVICE "cpu"
#define KILN_KV_SUITE KvFiles
#include "kv_files_cases.h"
