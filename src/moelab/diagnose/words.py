"""Cause words scored over the whole log: layer 3, used when no rule and no structure decided.

Each cause has words that people and programs use around it; a log that never says "CUDA out of
memory" verbatim may still say "OOM" and "GPU" on one line and "KV cache" on another. Scores add
up per cause over lines that look like errors (or every line of a short log); the best cause wins
when it clearly leads, and the scores become the alternatives' confidences.

    >>> score(["ERROR: the GPU ran OOM while growing the KV cache"])[0][0].value
    'gpu_oom'

A device API's or the operating system's "invalid argument" is a value refused in a call, not a flag:

    >>> [c.value for c, _, _ in score(["error: invalid argument: --no-warmup"])]
    ['bad_args']
    >>> score(["RuntimeError: CUDA error: invalid argument"]), score(["OSError: [Errno 22] Invalid argument"])
    ([], [])
"""
from __future__ import annotations

import re

from moelab.spec import Cause

# GPU generations and parts named in "not supported on X"
_ARCHES = (r"kepler|maxwell|pascal|volta|turing|ampere|ada(?: lovelace)?|hopper|blackwell|gfx\d{3,4}\w?|cdna\d?|rdna\d?|"
           r"mi\d{2,3}x?|[vpt]100|t4|a10g?|a100|h100|h200|b200|l4|l40s?|rtx ?\d{4}|gtx ?\d{3,4}|sm_?\d{2,3}")
# Memory that ran out, in any program's words ("Resource exhausted", "ErrorOutOfDeviceMemory", "not enough
# memory", "failed to allocate"), and where: the device (a GPU, its HBM, the KV cache) or the host (RAM, swap,
# the page file, a container's limit). A line that names no place takes it from the lines around it.
_EXHAUSTED = re.compile(r"\bout of (?!shared\b)(?:\w+ )?memory\b|\boom\b|\b(?:not enough|insufficient|no (?:available|free|more)|low on) "
                        r"(?!shared\b)(?:\w+ )?memory\b|\bran out of (?:\w+ )?memory\b|\b(?:paging|page|swap) file is too small\b|"
                        r"\b(?:WinError|os error) 1455\b|\bErrno 12\b|\bENOMEM\b|\bmemory (?:is )?(?:exhausted|full)\b|"
                        r"\bresource[_ ]exhausted\b|\b(?:fail\w*|unable|cannot|could not|can't|couldn't) (?:to )?allocat\w*|"
                        r"\ballocat\w* (?:of [^,;]{0,40}?)?(?:failed|error)\b|\balloc(?:ation)?_?failed\b|outof\w*memory|out_of_(?:device_|host_)?memory|"
                        r"\bexceed\w* (?:the )?(?:\w+ )?(?:memory|capacity)\b|\bmemory pressure\b|\bbad_alloc\b|\bMemoryError\b",
                        re.I)
_DEVICE = re.compile(r"(?<![a-z])hbm\d*\b|\b(?:cuda\w*|gpus?|vram|device|rocm\d*|hip\w*|vulkan|vk|metal|mps|xpu|npu|tpu|cublas\w*|"
                     r"cudnn\w*|kv[ -]?cache|cache blocks|mem[-_]fraction\w*|gpu[-_]memory[-_]utilization|video memory|"
                     r"accelerator|outofdevicememory|errorout\w*devicememory|\w*out_of_device_memory)\b", re.I)
# what only the host's memory says, whatever else the line names (a page file too small to load a CUDA DLL)
_HOST_SURE = re.compile(r"\b(?:paging|page|swap) file\b|\b(?:WinError|os error) 1455\b|\bErrno 12\b|\bENOMEM\b|"
                        r"CPUAllocator|\bbad_alloc\b|\bMemoryError\b|\bcannot allocate memory\b", re.I)
# ... and what names the host among other words
_HOST = re.compile(_HOST_SURE.pattern + r"|cpu|\b(?:host|system (?:ram|memory)|ram|swap|pagefile|virtual memory|mmap|malloc|java|pod|"
                   r"container|cgroup|for an array|memory pressure|commit_memory)\b", re.I)


def memory_place(texts: list[str], n: int) -> str | None:
    """"device", "host" or None: where the memory that line n (0-based) says ran out lives, read from
    the line itself, then from the two lines either side.

    >>> memory_place(["ggml_vulkan: Device memory allocation of size 118497280 failed."], 0)
    'device'
    >>> memory_place(["OSError: [WinError 1455] The paging file is too small (loading cudnn64_8.dll)"], 0)
    'host'
    >>> memory_place(["Traceback (most recent call last):", "MemoryError"], 1)
    'host'
    >>> memory_place(["RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 bytes."], 0) is None
    True
    """
    if _HOST_SURE.search(texts[n]):
        return "host"
    for lo, hi in ((n, n + 1), (n - 2, n + 3)):
        around = " ".join(texts[max(0, lo):hi])
        dev, host = bool(_DEVICE.search(around)), bool(_HOST.search(around))
        if dev != host:
            return "device" if dev else "host"
        if dev:  # both ("device:CPU:0", "CPU offload ... GPU"): the log does not say
            return None
    return None


# cause -> (pattern, weight); patterns are searched case-insensitively in each line
WORDS: dict[Cause, tuple[tuple[str, float], ...]] = {
    Cause.gpu_oom: ((r"\b(?:cuda|gpu|vram|device|hip|mps|xpu|npu|metal|rocm|vulkan)\b.*\b(?:oom|out of memory)\b|"
                     r"\b(?:oom|out of memory)\b.*\b(?:cuda|gpu|vram|device)\b", 3),
                    (r"\b(?:kv[ -]?cache|cache blocks)\b.*\b(?:too small|not enough|insufficient|no room|exceed|no (?:available|free) memory)|"
                     r"\b(?:larger|more) than\b.{0,80}\b(?:can be stored|fit) in (?:the )?kv[ -]?cache|"
                     r"\bno (?:available|free) memory for (?:the )?(?:kv[ -]?)?cache|"
                     r"\bkv[ -]?cache\b.{0,80}\b(?:needed|required)\b.{0,40}\b(?:larger|more) than\b|"
                     r"\b(?:larger|more) than (?:the )?(?:available |free )?kv[ -]?cache\b", 3),
                    (r"\b(?:increas|decreas|lower|reduc|rais)\w*\b.{0,40}(?:mem[-_]fraction|gpu[-_]memory[-_]utili[sz]ation)", 2),
                    # a device API's own allocation failure codes
                    (r"\b(?:cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|hipErrorOutOfMemory|CUBLAS_STATUS_ALLOC_FAILED|"
                     r"CUDNN_STATUS_ALLOC_FAILED|\w*OutOfDeviceMemory\w*)\b", 3),
                    # one buffer over the device's limit (Metal's maxBufferLength, a Vulkan heap)
                    (r"buffer\S*\s.{0,60}?\bmust not exceed \d+|\b(?:exceeds?|(?:greater|more|larger) than) (?:the )?max(?:imum)? "
                     r"(?:allowed )?buffer (?:size|length)\b", 3), (r"\bcudaMalloc\b", 2),
                    (r"\b(?:not enough|insufficient)\b.*\b(?:gpu|vram|device|video) memory\b|\bfail\w* to allocate\b.*\b(?:kv[ -]?cache|gpu|vram|cuda|device)\b", 3),
                    # "Insufficient VRAM for model and cache", "ran out of VRAM"
                    (r"\b(?:not enough|insufficient|out of|ran out of|exceeds?(?: the)?(?: available)?)\s+(?:free\s+)?vram\b", 3),
                    # TensorRT: "Requested amount of GPU memory (N bytes) could not be allocated", "Error Code 2: OutOfMemory"
                    (r"\b(?:gpu|device|cuda|vram) memory\b.*\b(?:could not|cannot|can't|unable to) be allocated\b|"
                     r"\bError Code \d+: OutOfMemory\b", 3),
                    # a device allocator's arena (ONNX Runtime's BFCArena, TensorFlow's GPU_0_bfc) that could not grow
                    (r"\b(?:bfc ?arena|gpu_\d+_bfc|cuda ?arena)\b.*\b(?:fail\w* to allocate|ran out of memory|out of memory)\b", 3)),
    Cause.host_oom: ((r"\b(?:system|host|cpu) memory\b|\bRAM\b.*\b(?:exhaust|not enough|insufficient|out of)", 2),
                     (r"\boom[- ]?kill", 3), (r"cannot allocate memory|\bENOMEM\b", 2),
                     (r"\balloc\w*\b.*\b(?:system|host|cpu) (?:ram|memory)\b", 2),
                     # a load bigger than the host's memory, said by the loader before it dies
                     (r"\b(?:exceeds?|larger than|more than|bigger than)\b.{0,30}\b(?:available|free|total) "
                      r"(?:RAM|system memory|host memory|CPU memory)\b", 2)),
    Cause.port_in_use: ((r"\baddress (?:already )?in use\b|\bport\b.*\b(?:in use|taken|busy|occupied)\b", 3),
                        (r"\b(?:bind|listen)\b.*\b(?:fail|error|denied)|\bfail\w* to (?:bind|listen)\b", 2),
                        (r"\blisten (?:tcp|udp)\d? \S*:\d+: bind:|only one usage of each socket address|\bE?ADDRINUSE\b|"
                         r"\bWSAEADDRINUSE\b|\b(?:couldn't|could not|cannot|can't|unable to) (?:bind|listen)\b|"
                         r"\bcannot assign requested address\b|\b(?:bind|listen)\b.{0,80}\b(?:EACCES|EADDRNOTAVAIL)\b|"
                         r"\b(?:EACCES|EADDRNOTAVAIL)\b.{0,80}\b(?:bind|listen)\b", 3)),
    Cause.startup_timeout: ((r"\btime[sd]? ?out\b.*\b(?:start|ready|readiness|startup|load|launch|health)", 3),
                            (r"\b(?:start|ready|startup|load|initiali[sz])\w*\b.*\btime[sd]? ?out\b", 3), (r"not ready (?:after|within)", 3),
                            (r"\b(?:did not|didn't|failed to) (?:respond|answer|become ready)\b.*\b(?:in|within|after) \d+", 2),
                            (r"\bhealth ?check\b.*\b(?:fail|not ready|unhealthy)", 2),
                            (r"\bfail\w* to become (?:healthy|ready|available)\b|\b(?:is|became|marked|reported) unhealthy\b|"
                             r"\btimed? ?out waiting for (?:the )?\w+ to (?:start|send|be ready|become|respond|load|come up|connect)", 3)),
    Cause.hang: ((r"\b(?:stuck|hung|hangs?|hanging|deadlock|freez\w*|no progress|(?:not|without) making progress)\b", 2),
                 # stuck for a stated time: a watchdog's own count
                 (r"\b(?:stuck|hung|no progress|without (?:making )?progress)\b.{0,20}\bfor \d+ ?(?:s|secs?|seconds|mins?|minutes)\b", 3),
                 (r"\bwatchdog\b", 2), (r"\bnot responding\b", 1),
                 (r"\bno (?:new )?tokens? (?:generated|produced)\b|\bno output for \d+", 2),
                 # a running engine's call to its workers that never came back
                 (r"\brpc\b.{0,40}\btimed? ?out\b|\btimed? ?out\b.{0,20}\bwaiting for (?:the )?(?:outputs?|responses?|results?|"
                  r"repl(?:y|ies)|steps?)\b", 3),
                 # a client that reached the server and waited in vain for its answer (a refused or unreachable
                 # server says so at connect time, not on the read)
                 (r"\bread timed out\b|\bReadTimeout(?:Error)?\b", 2)),
    Cause.numerical_nan: ((r"\bnan\b|\binf\b.*\bnan\b|non-finite|not finite", 3),),
    # "terminated" alone is no outside kill: gcc's "compilation terminated.", ollama's "runner process has terminated"
    Cause.killed_external: ((r"\bsigterm\b|\bsignal 15\b|\bevict\w*|\bpreempt\w*|\b(?:was|been|got|being) (?:terminated|killed)\b|"
                             r"\bterminated by\b|^terminated$", 2), (r"\bkilled\b", 1)),
    Cause.native_crash: ((r"\bsegfault|segmentation fault|core dumped|\bsigsegv\b|\bsigabrt\b|\babort(?:ed)?\b|stack smashing|"
                          r"illegal instruction(?! was encountered)|bus error", 3),
                         # Windows: the NTSTATUS of an access violation, a stack buffer overrun, an illegal instruction, a heap corruption
                         (r"\b0x[cC]0000(?:005|409|01[dD]|374|096|0[fF][dD])\b|\b(?:3221225477|3221226505|3221225501)\b|"
                          r"\bSTATUS_(?:ACCESS_VIOLATION|STACK_BUFFER_OVERRUN|ILLEGAL_INSTRUCTION|HEAP_CORRUPTION)\b|\baccess violation\b", 3),
                         (r"\bsignal:? \(?(?:4|6|7|8|11)\)?(?: received)?\b|\breceived signal (?:4|6|7|8|11|SIG\w+)\b|"
                          r"\bsignal: (?:illegal instruction|segmentation fault|aborted|bus error)", 3)),
    # a model's architecture ("Model architectures ['XForCausalLM'] are not supported. Supported architectures: ...")
    # is the model's, not the GPU's
    Cause.unsupported_arch: ((r"^(?!.*\b(?:peer access|p2p)\b).*\b(?:not|no longer|isn.t|un)\s?support\w*\b.*\b(?:gpu|device|(?<!model )(?<!supported )arch\w*|sm_?\d+|compute capability|"
                              r"hardware|platform|cuda capability)", 3), (r"\bonly (?:supported|supports?|works|runs)(?: on)?\b.*\b(?:gpus?|devices?|sm_?\d+|compute capability|"
                              r"ampere|hopper|blackwell|ada|turing|volta)\b", 3), (r"\bcompute capability\b", 2), (r"\bsm_?\d{2,3}\b", 1),
                             # "PagedKV Context FMHA is not supported on Volta": a feature refused on a named GPU generation
                             (r"\b(?:not|isn.t|un)\s?(?:yet )?support\w*\b (?:on|for|by) (?:the )?(?:nvidia |amd )?(?:"
                              + _ARCHES + r")\b", 3),
                             (r"no kernel image|\bno compatible code objects?\b|\bno binary for (?:the )?gpu\b", 3),
                             (r"\b(?:arch\w*|sm(?: version)?|gpu|device|compute capability|cuda capability)\s+(?:is\s+)?unsupported\b|"
                              r"\bunsupported (?:sm|arch\w*|gpu|device|compute capability|cuda capability)\b|"
                              r"\bminimum (?:cuda|compute) capability\b|\b(?:gpu|device|card) (?:is )?too old\b|"
                              r"\bno longer supports? this (?:gpu|device|card)\b|"
                              # HIP's: no code object built for this GPU
                              r"\bhipErrorNoBinaryForGpu\b|\b(?:couldn.t|coudn.t|could not|cannot|can.t) find (?:a )?binary for "
                              r"(?:the )?(?:current )?(?:gpu|device)s?\b|"
                              # a library's kernels for this GPU missing ("rocBLAS error: Cannot read .../TensileLibrary.dat:
                              # No such file or directory for GPU arch : gfx1032")
                              r"\b(?:cannot|can't|could not|couldn't|unable to|failed to) (?:read|find|load|open)\b.{0,200}"
                              r"\bfor (?:the )?(?:gpu |device )?arch(?:itecture)?\s*:?\s*(?:gfx|sm_?)\w+", 3)),
    # "invalid argument" is also a device API's or the OS's refusal of a value (cudaErrorInvalidValue's "CUDA
    # error: invalid argument", EINVAL's "[Errno 22] Invalid argument"), which no flag caused
    Cause.bad_args: ((r"\bunrecognized (?:argument|option)|\binvalid (?:value|choice|option)|"
                      r"^(?!.*\b(?:cuda|hip|cudnn|cublas|nccl|rccl|mpi|errno 22|einval|cudaError\w*)\b.{0,30}invalid argument)"
                      r".*\binvalid argument|"
                      r"\bunknown (?:argument|option|flag|parameter|config(?:uration)? (?:key|option)|setting)s?\b|"
                      # a setting given through the environment and refused ("invalid environment variable, using
                      # default key=OLLAMA_CONTEXT_LENGTH")
                      r"\binvalid (?:environment variable|env(?:ironment)? var\w*|setting)s?\b|"
                      # a value refused with the values that are allowed ("placement group bundle index 6 is invalid.
                      # Valid placement group indexes: 0-4")
                      r"\bis (?:invalid|not valid)\b.{0,40}\b(?:valid|allowed|supported) (?:[\w-]+ ){0,3}(?:values?|options?|"
                      r"choices?|indexes|indices|range|ones)\b|"
                      # a Rust extension's (PyO3's) refusal of an argument's type ("argument 'worker_urls': 'NoneType'
                      # object cannot be converted to 'Sequence'")
                      r"\bargument '[\w-]+': .{0,80}\bcannot be converted to\b", 3),
                     # a flag held to a requirement on an error line: "Use of '--load-model' requires setting
                     # '--model-control-mode=explicit'", "--x must be ...", "Pass --model-name or --model-path"
                     (r"(?<![\w-])--[a-z][\w-]+['\"`]?\s.{0,80}?\b(?:requires?|must|cannot|can't|is not (?:supported|allowed|valid)|"
                      r"only (?:supported|allowed|valid)|(?:is |are )?invalid|not (?:compatible|allowed)|needs? to be)\b", 3),
                     (r"\b(?:requires?|must (?:set|pass|specify|provide|use)|please (?:pass|specify|provide|set)|^(?:\w+: )*pass|"
                      r"specify|provide)\b (?:either |both |also |one of )?['\"`]?--[a-z][\w-]+", 2), (r"\bmust be\b.*(?:[<>]|\b(?:less|greater|between|divisible|positive|smaller|larger|at (?:least|most))\b)", 2),
                     (r"\bunexpected argument\b|\bflag provided but not defined\b|\bexpected value for (?:argument|option)\b|"
                      r"\berror while handling argument\b|\bunk?n?own value for\b|\binvalid value '[^']*' for\b|"
                      r"\bthe following arguments are required\b|\b(?:requires|expects?) (?:a |an )?(?:value|argument)\b|"
                      r"\b(?:cannot|can't|may not) be (?:used|combined|specified) (?:together )?with\b|\bmutually exclusive\b|"
                      r"\bconflicting (?:options|arguments|flags)\b", 3),
                     (r"\bnot divisible\b", 3),
                     # a value refused against the checkpoint's or another flag's: "Quantization method specified in
                     # the model config (gptq) does not match the quantization method specified in the `quantization` argument"
                     (r"\b(?:does not|doesn't|do not|did not) match\b.{0,100}\b(?:specified|given|passed|set) (?:in|by|with|to|on) "
                      r"(?:the )?[`'\"]?-{0,2}[\w-]+[`'\"]? (?:argument|flag|option|parameter)\b", 3),
                     # argparse's own refusal: "vllm serve: error: argument --x: invalid loads value: '...'"
                     (r"^(?:[\w.-]+ ){0,2}?[\w.-]+: error: (?:argument -{1,2}\w|unrecognized arguments\b)|"
                      r"\binvalid \w+ value: [\'\"]", 4),
                     # a spec or config refused by its validator: Kubernetes' admission webhooks and kubectl's schema,
                     # a required key missing, a number flag given a word (C++'s stoi), a setting too large or small
                     (r"\badmission webhook\b.{0,80}\bdenied the request\b|\berror validating data\b|"
                      r"\bmissing required (?:field|argument|option|parameter|key|property|setting)s?\b|\bunknown field\b|"
                      r"\((?:stoi|stol|stoll|stof|stod|stoul)\)|: (?:stoi|stof|stod)$|"
                      r"\btoo (?:large|big|small|many|few|high|low|long) (?:a |an )?[a-z_ -]{0,30}?\b(?:space|size|value|length|"
                      r"count|number|ratio|fraction|utili[sz]ation|parallel\w*)\b", 3),
                     # a launch whose process count does not match the parallel sizes asked ("mpiSize == tp * pp")
                     (r"\b(?:mpi|world)_?size\b\s*(?:==|!=)\s*\w+\s*\*\s*\w+|\b(?:mpi|world)[ _]?size\b.{0,40}\b(?:does not|doesn't) match\b", 3),
                     # a model that cannot be split the way the flags ask
                     (r"\b(?:tensor[ _-]parallel\w*(?:[ _-]size)?|tp[ _-]size|sharding|shards|world[ _-]size|pipeline[ _-]parallel\w*)\b"
                      r".{0,60}\b(?:not (?:compatible|divisible|supported|aligned)|too (?:large|big|small)|must\b)|"
                      r"\btoo (?:large|big|small) (?:a )?(?:tensor[ _-]parallel|tp)\b|\bnot (?:compatible|aligned) with (?:sharding|\d+ shards)", 3),
                     (r"\bincompatible\b.*\b(?:flag|option|argument|setting)", 2), (r"^usage: ", 2),
                     # a feature switched on where it cannot be: "Paged KV cache is not supported for this model yet",
                     # "When KV cache block reuse is set, model has to be built with paged context FMHA support"
                     (r"\bis not (?:yet )?supported (?:for|with|by) (?:this|the) (?:model|checkpoint|architecture|quantization|engine)\b|"
                      r"\bwhen\b.{3,80}\b(?:is|are) (?:set|enabled|on|used|true)\b.{0,80}\b(?:must|has to|have to|needs? to|requires?)\b", 2),
                     # a malformed address in a setting ("WARN invalid port", a host with a colon or a stray character)
                     (r"\binvalid (?:port|host|hostname|address|url|endpoint)\b|"
                      r"\blookup (?:[^\s:]*[:%\\\u3000-\uffff][^\s]*|[A-Za-z]): no such host\b", 3)),
    Cause.model_load_error: ((r"\b(?:error|fail\w*) (?:loading|to load|to read)\b.*\b(?:model|weights?|checkpoint|tokenizer|gguf)", 3),
                             (r"unknown (?:model )?architecture|architectures? .* not supported|"
                              # a refusal that asks for trust_remote_code, not a command line that passes it
                              r"\b(?:requires?|need\w*|set|pass|enable|allow|execute)\b.{0,60}trust[_ -]remote[_ -]code|"
                              r"trust[_ -]remote[_ -]code\b.{0,20}\b(?:must|is required|is needed|to (?:load|run|execute))|"
                              r"\bmodel (?:type|architecture|class)\b.{0,40}\bnot (?:yet )?supported|"
                              r"\bunsupported model (?:type|architecture)\b|"
                              # a library that cannot place a checkpoint's model type ("... has model type qwen3_moe
                              # but Transformers does not recognize this architecture")
                              r"\b(?:does not|doesn't|did not|cannot|can't) recogni[sz]e (?:this|the|that) (?:model )?architecture\b", 3),
                             (r"corrupt\w*\b.*\b(?:file|model|weights)", 2),
                             # a file's magic bytes refused: the loader cannot read that format ("invalid file
                             # magic", "bad magic number"), whatever the program
                             (r"\b(?:invalid|bad|wrong|unknown|unexpected|unsupported)\b(?: \w+){0,2} magic\b", 3),
                             # the files a loader looks for, said missing in its own words ("No supported config
                             # format found in X", "wrong number of tensors; expected 255, got 254")
                             (r"\bno (?:supported |valid )?(?:config(?:uration)?|model|weights?|checkpoint|tokenizer|safetensors)\b"
                              r".{0,30}\bfound\b|\bwrong number of tensors\b|\b(?:missing|cannot find|could not find) tensor\b|"
                              # a weight's name the loader looked for ("Could not find model.embed_tokens.* in model")
                              r"\b(?:cannot|can't|could not|couldn't|unable to) find [\w.*]+\.[\w.*]+ in (?:the )?(?:model|checkpoint|"
                              r"state[_ ]dict|weights)\b|"
                              r"\b(?:config|tokenizer|tokenizer_config|generation_config)\.json\b.{0,60}\b(?:not found|no such file|"
                              r"does not exist|missing)\b|\bdoes not appear to have a file named\b", 3)),
    Cause.jit_compile_error: ((r"\b(?:compil(?:e|ation)|build)\b.*\b(?:fail|error)", 2), (r"\bninja\b|\bnvcc\b|\bptxas\b|\bnvrtc\b", 2),
                              (r"cannot find -l\w+|undefined reference|collect2: error|\bld returned\b|^compilation terminated\.?$|"
                               r"\bfatal error: [\w./+-]+\.(?:h|hpp|cuh|hxx): No such file", 3)),
    Cause.collective_error: ((r"\bnccl\b|\bc10d\b|\bgloo\b|\brendezvous\b|\ball[-_ ]?reduce\b|\bprocessgroup", 2),
                             (r"\bcollective\b", 1),
                             (r"\bcollective (?:operation )?time[ds]? ?out\b|\bwatchdog caught collective\b|\bWorkNCCL\b|"
                              r"\bOpType=(?:ALLREDUCE|ALLGATHER|REDUCE_SCATTER|BROADCAST|ALLTOALL\w*|SEND|RECV)\b", 3),
                             # the other collective libraries' own error marks (oneCCL, Ascend's HCCL, ROCm's RCCL)
                             (r"\|CCL_ERROR\||\bfailed to initialize ATL\b|\b(?:hccl|rccl|oneccl)\w*\b.{0,60}\b(?:error|fail\w*|timed? ?out)\b", 3),
                             # GPUs that cannot reach each other's memory (no P2P): a custom all-reduce's refusal
                             (r"\bpeer access\b.{0,40}\b(?:not supported|unsupported|not available|disabled|fail\w*)\b|"
                              r"\bp2p\b.{0,40}\b(?:not supported|unsupported|not available|fail\w*)\b", 3)),
    Cause.kernel_resource_limit: ((r"\bshared memory\b.*\b(?:exceed|limit|too much|required|(?:more|larger|greater) than)|"
                                   r"\btoo much shared (?:data|memory)\b|"
                                   r"\btoo many resources\b|\bout of resources?\b|\bregisters?\b.*\b(?:exceed|too many)|"
                                   r"\bmax\w*SharedMemory\w*", 3),
                                  # a launch wider than the device allows: Metal's threads per threadgroup, CUDA's block
                                  (r"\b(?:thread ?group|work ?group|block|threads)(?: size)?\b.{0,40}\b(?:greater|more|larger) than\b"
                                   r".{0,40}\bmax\w*\b.{0,30}\bthreads?\b|\bmax\w* threads per (?:threadgroup|block)\b.{0,30}\bexceed", 3)),
    Cause.illegal_memory_access: ((r"illegal (?:memory access|address)|\ban illegal instruction was encountered\b|device-side assert|"
                                   r"misaligned address|\bxid\b|launch failure|\.cu:\d+: .*\bAssertion\b.*\bfailed\b|"
                                   r"\bcudaErrorIllegal\w*|\bCUDA error: .*\billegal\b|"
                                   # ROCm's words for the same fault
                                   r"\bmemory access fault by (?:gpu|device)\b|\bhipErrorIllegal\w*", 3),),
    Cause.orphan_leak: ((r"\borphan\w*|\bzombie\b|\bleak\w*\b|left behind|still (?:running|alive)|reparent", 2),),
}
_PLACE = {Cause.gpu_oom: "device", Cause.host_oom: "host"}
# Memory that ran out with no place named: an operating system's refusal says so (ENOMEM, "Cannot allocate
# memory", a page file) and a host kill says `Killed`, so a bare "out of memory while trying to allocate"
# is, in the logs of this field, an accelerator's allocator: the device leads, the host stays second.
_UNPLACED = {Cause.gpu_oom: 2, Cause.host_oom: 1}
_USAGE = re.compile(r"^\s*usage:\s", re.I)
_COMPILED = {c: [(re.compile(p, re.I), w) for p, w in ws] for c, ws in WORDS.items()}
_ERRORISH = re.compile(r"error|fail|fatal|exception|killed|abort|crash|timeout|timed out|refus|denied|warn|cannot|"
                       r"unable|not supported|invalid|stuck|nan\b|unsupported|no longer support|too old|only supports?\b|"
                       r"^usage:|unexpected argument|unrecognized|\bbind\b|illegal|assert|signal|core dumped|unhealthy|"
                       r"0x[cC]0000|too many resources|not divisible|terminated", re.I)


def _innermost(t: str, line: dict[Cause, float]) -> dict[Cause, float]:
    """A wrapped error ("failed to load 'm': Invalid argument: unexpected maximum batch size 64") says its
    root last: of the causes one line names, the one its innermost clause names by itself decides.

    >>> _innermost("failed to load 'm' version 1: Invalid argument: unexpected batch size",
    ...            {Cause.bad_args: 3, Cause.model_load_error: 3})
    {<Cause.bad_args: 'bad_args'>: 4}
    """
    parts = t.split(": ")
    for k in range(len(parts) - 1, 0, -1):
        tail = ": ".join(parts[k:])
        hit = {c: max((wt for rx, wt in _COMPILED[c] if rx.search(tail)), default=0) for c in line}
        best = max(hit.values())
        if best >= 3:
            top = [c for c, w in hit.items() if w == best]
            return {top[0]: line[top[0]] + 1} if len(top) == 1 else line
    return line


def score(texts: list[str], max_lines: int = 20000) -> list[tuple[Cause, float, int]]:
    """[(cause, score, first line)] best first; only lines that read like errors count, except in
    short logs (a few pasted lines are all evidence)."""
    short = len(texts) <= 12
    totals: dict[Cause, float] = {}
    first: dict[Cause, int] = {}
    for n, t in enumerate(texts[:max_lines], 1):
        ran_out = _EXHAUSTED.search(t) if t else None
        if not t or (not short and not ran_out and not _ERRORISH.search(t)):
            continue
        usage = _USAGE.match(t)  # a usage or help line lists every flag: it says only that the flags were refused
        place = memory_place(texts, n - 1) if ran_out and not usage else None
        line: dict[Cause, float] = {}
        for cause, pats in _COMPILED.items():
            if usage and cause is not Cause.bad_args:
                continue
            w = max((wt for rx, wt in pats if rx.search(t)), default=0)
            if ran_out and not usage and cause in _PLACE:
                w = max(w, 3 if place == _PLACE[cause] else _UNPLACED[cause] if place is None else 0)
            if w:
                line[cause] = w
        if len(line) > 1 and ": " in t:
            line = _innermost(t, line)
        for cause, w in line.items():
            totals[cause] = totals.get(cause, 0) + w
            first.setdefault(cause, n)
    return sorted(((c, s, first[c]) for c, s in totals.items()), key=lambda x: (-x[1], x[2]))
