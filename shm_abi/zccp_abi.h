/*
 * ZCCP shared-memory ABI, version 2.
 *
 * The ONE source of truth for the binary layout shared by nginx (LuaJIT ffi.cdef)
 * and the engine (cffi).  Both load this file unchanged, so it holds plain C
 * declarations only: no macros, no includes, no function prototypes.
 * Integers are host byte order (both sides run on the same host).
 * Field-by-field documentation: shm_abi/README.md.
 */

enum zccp_abi_const {
    ZCCP_ABI_VERSION        = 2,
    ZCCP_CONTROL_MAGIC      = 0x5A434350,   /* "PCCZ" little-endian: arena control page */
    ZCCP_SLOT_MAGIC         = 0xCAFEBABE,   /* every slot header */
    ZCCP_PAGE_SIZE          = 4096,         /* regions start on this boundary */
    ZCCP_CONTROL_SIZE       = 4096,         /* sizeof(struct zccp_control) */
    ZCCP_SLOT_HEADER_SIZE   = 128,          /* sizeof(struct zccp_slot_header) */
    ZCCP_SLOT_META_SIZE     = 256,          /* sizeof(struct zccp_slot_meta) */
    ZCCP_SLOT_META_OFFSET   = 128,          /* meta block follows the header */
    ZCCP_SLOT_SIG_OFFSET    = 384,          /* MinHash signature follows the meta block */
    ZCCP_SLOT_SIG_SIZE      = 512,          /* sizeof(struct zccp_slot_signature) */
    ZCCP_SLOT_REQ_OFFSET    = 896,          /* the request block follows the signature */
    ZCCP_SLOT_REQ_SIZE      = 256,          /* sizeof(struct zccp_slot_request) */
    ZCCP_REQUEST_ID_MAX     = 64,           /* bytes of X-Request-ID kept */
    ZCCP_TRACESTATE_MAX     = 512,          /* bytes of a client's W3C tracestate kept (whole entries) */
    ZCCP_L1_SPAN_SIZE       = 128,          /* sizeof(struct zccp_l1_span) */
    ZCCP_CSF_BANDS          = 16,
    ZCCP_MINHASH_COUNT      = 128,
    ZCCP_RING_SIZE          = 16,           /* sizeof(struct zccp_ring) */
    ZCCP_NOTICE_SIZE        = 32,           /* sizeof(struct zccp_notice) */
    ZCCP_SOCKET_PATH_MAX    = 108           /* sun_path */
};

/* Slot life cycle; see the state machine in shm_abi/README.md. */
enum zccp_slot_state {
    ZCCP_STATE_FREE      = 0,
    ZCCP_STATE_WRITING   = 1,   /* nginx owns it and is filling the payload */
    ZCCP_STATE_READY     = 2,   /* nginx rang; engine may read */
    ZCCP_STATE_RUNNING   = 3,   /* engine accepted the ring */
    ZCCP_STATE_STREAMING = 4,   /* engine is committing response bytes */
    ZCCP_STATE_DONE      = 5,   /* response complete; status is final */
    ZCCP_STATE_FAILED    = 6    /* engine gave up; status + error body written */
};

enum zccp_slot_flags {
    ZCCP_FLAG_API_OPENAI    = 1,    /* nginx: body is an OpenAI request, request.openai_api's (else Anthropic) */
    ZCCP_FLAG_MASKED        = 2,    /* nginx: a mask pattern changed the prompt text */
    ZCCP_FLAG_FP_COMPLETE   = 4,    /* nginx: near hits allowed (a text-only final user turn, wholly fingerprinted) */
    ZCCP_FLAG_NO_CACHE      = 8,    /* nginx: Cache-Control: no-cache (skip lookup) */
    ZCCP_FLAG_NO_STORE      = 16,   /* nginx: Cache-Control: no-store (skip store) */
    ZCCP_FLAG_FP_VALID      = 32,   /* nginx: csf_key, csf_bands, exact_key are filled */
    ZCCP_FLAG_TENANT        = 64,   /* nginx: request.tenant holds the tenant's digest */
    ZCCP_FLAG_MASK_DIGEST   = 128,  /* nginx: request.mask_digest names the mask set it applied */
    ZCCP_FLAG_RESPONSE_SSE  = 256,  /* engine: the response is text/event-stream */
    ZCCP_FLAG_SAMPLED_ON    = 512,  /* nginx: X-ZCCP-Cache-Sampled: on (cache this sampled request) */
    ZCCP_FLAG_SAMPLED_OFF   = 1024  /* nginx: X-ZCCP-Cache-Sampled: off (never cache it) */
};

/* What a slot asks of the engine (request.kind); the API's shape is ZCCP_FLAG_API_OPENAI. */
enum zccp_request_kind {
    ZCCP_KIND_GENERATE     = 0,     /* POST /v1/messages, POST /v1/chat/completions */
    ZCCP_KIND_COUNT_TOKENS = 1,     /* POST /v1/messages/count_tokens */
    ZCCP_KIND_MODELS       = 2,     /* GET /v1/models */
    ZCCP_KIND_WARMUP       = 3,     /* POST /v1/zccp/warmup (loopback or unix socket only) */
    ZCCP_KIND_PURGE        = 4,     /* POST /v1/zccp/purge (loopback or unix socket only) */
    ZCCP_KIND_SPANS        = 5      /* nginx's own (a timer, no client): the payload is struct
                                       zccp_l1_span records, the spans of L1 hits; answered 204 */
};

/* Which OpenAI endpoint a GENERATE slot's body is for (request.openai_api, with
   ZCCP_FLAG_API_OPENAI); 0, the zeroed block, is Chat Completions. */
enum zccp_openai_api {
    ZCCP_OPENAI_CHAT        = 0,    /* POST /v1/chat/completions */
    ZCCP_OPENAI_COMPLETIONS = 1,    /* POST /v1/completions (legacy prompt completions) */
    ZCCP_OPENAI_RESPONSES   = 2     /* POST /v1/responses (stateless) */
};

enum zccp_cache_status {
    ZCCP_CACHE_NONE   = 0,
    ZCCP_CACHE_HIT    = 1,
    ZCCP_CACHE_NEAR   = 2,
    ZCCP_CACHE_MISS   = 3,
    ZCCP_CACHE_BYPASS = 4,
    ZCCP_CACHE_ERROR  = 5
};

/* Why a cache answer was not served (meta.cache_reason; X-ZCCP-Cache-Reason). */
enum zccp_cache_reason {
    ZCCP_REASON_NONE           = 0,
    ZCCP_REASON_MASKED_LITERAL = 1, /* the cached answer carries a masked value this request lacks */
    ZCCP_REASON_SAMPLED        = 2  /* a sampled request (temperature > 0, no seed) skipped the lookup */
};

enum zccp_engine_state {
    ZCCP_ENGINE_STARTING = 0,
    ZCCP_ENGINE_SERVING  = 1,
    ZCCP_ENGINE_STOPPING = 2
};

/* Doorbell opcodes (first field of every frame). */
enum zccp_op {
    ZCCP_OP_RING   = 1,     /* nginx -> engine: slot is READY at this generation */
    ZCCP_OP_PING   = 2,     /* nginx -> engine: health probe */
    ZCCP_OP_NOTICE = 16,    /* engine -> nginx: response_len bytes committed; final=1 when done */
    ZCCP_OP_PONG   = 17,    /* engine -> nginx: slot=slot_count, generation=epoch */
    ZCCP_OP_REJECT = 18     /* engine -> nginx: ring ignored (stale generation, bad slot/header) */
};

/* Page 0 of the arena, written once by the engine at start-up. */
struct zccp_control {
    uint64_t magic;             /* ZCCP_CONTROL_MAGIC */
    uint32_t abi_version;       /* ZCCP_ABI_VERSION */
    uint32_t engine_state;      /* enum zccp_engine_state */
    uint64_t epoch;             /* random per engine start; nginx re-maps when it changes */
    int32_t  engine_pid;
    uint32_t slot_count;
    uint32_t slot_size;         /* bytes per slot, multiple of ZCCP_PAGE_SIZE */
    uint32_t payload_offset;    /* region offsets are relative to the slot start */
    uint32_t payload_cap;       /* bytes */
    uint32_t tokens_offset;
    uint32_t tokens_cap;        /* u32 token ids */
    uint32_t response_offset;
    uint32_t response_cap;      /* bytes */
    uint32_t reserved0;
    uint64_t started_ns;        /* CLOCK_REALTIME */
    uint8_t  socket_path[108];  /* doorbell socket, NUL-terminated */
    uint32_t reserved1;
    uint64_t purge_epoch;       /* the cache's purge epoch as the engine last read it from Redis; 0: unknown */
    uint32_t trace_on;          /* 1: the engine exports traces (nginx then sends its L1 hits' spans) */
    uint32_t trace_ratio_ppm;   /* the sampling ratio x 1e6 for a request without a client's traceparent */
    uint32_t doorbell_count;    /* n > 1: n processes, each also at socket_path + ".p<k>" (shm_abi/README.md) */
    uint8_t  reserved[3892];    /* pads the page to ZCCP_CONTROL_SIZE */
};

/* First 128 bytes of every slot. */
struct zccp_slot_header {
    uint64_t magic;             /*   0 ZCCP_SLOT_MAGIC */
    uint32_t version;           /*   8 ZCCP_ABI_VERSION */
    uint32_t state;             /*  12 enum zccp_slot_state */
    uint8_t  context_id[8];     /*  16 first 8 bytes of sha256; 8 random bytes when sha256 is zero */
    uint64_t timestamp_ns;      /*  24 CLOCK_REALTIME when the slot turned READY */
    uint64_t generation;        /*  32 bumped by nginx on every claim */
    uint64_t csf_key;           /*  40 64-bit hash of the MinHash signature */
    uint32_t flags;             /*  48 enum zccp_slot_flags */
    uint32_t status;            /*  52 HTTP status of the response */
    uint32_t payload_len;       /*  56 bytes of request body */
    uint32_t payload_cap;       /*  60 */
    uint32_t tokens_len;        /*  64 u32 token ids written by the engine */
    uint32_t tokens_cap;        /*  68 */
    uint32_t response_len;      /*  72 response bytes committed, cumulative (ring) */
    uint32_t response_cap;      /*  76 */
    int32_t  owner_pid;         /*  80 nginx worker that claimed the slot */
    uint32_t response_acked;    /*  84 response bytes nginx has consumed, cumulative */
    uint8_t  sha256[32];        /*  88 SHA-256(raw body); all zero for NO_CACHE + NO_STORE (no key needs it) */
    uint64_t deadline_ns;       /* 120 CLOCK_REALTIME after which nginx has given up */
};

/* Bytes 128..383 of every slot. */
struct zccp_slot_meta {
    uint32_t prompt_len;        /*   0 prompt tokens (engine) */
    uint32_t completion_len;    /*   4 generated tokens (engine; a whole answer's counted up as generated) */
    int32_t  gpu_device_id;     /*   8 -1 when the model ran on the CPU */
    uint32_t max_tokens;        /*  12 effective max_tokens (engine) */
    uint64_t csf_bands[16];     /*  16 LSH band keys (nginx) */
    uint8_t  exact_key[32];     /* 144 SHA-256 exact cache key (nginx) */
    uint32_t fp_tokens;         /* 176 prompt tokens the fingerprint saw (nginx) */
    uint32_t cache_status;      /* 180 enum zccp_cache_status (engine) */
    uint32_t similarity_ppm;    /* 184 estimated Jaccard x 1e6 on a NEAR hit (engine) */
    uint32_t age_s;             /* 188 age of the cache entry served (engine) */
    uint32_t plan_chunks;       /* 192 prefill chunks, 0 = single pass (engine) */
    uint32_t error_code;        /* 196 reserved for engine diagnostics */
    uint32_t cache_ttl_s;       /* 200 engine: nginx may keep this answer for so long (0: it must not) */
    uint32_t cache_scope;       /* 204 engine: 0 shared by every caller, 1 this tenant's only */
    uint32_t cache_reason;      /* 208 engine: enum zccp_cache_reason */
    uint32_t retry_after_s;     /* 212 engine: Retry-After of a 429/503 answer (0: nginx's 1) */
    uint64_t committed_mark;    /* 216 engine: (response_len << 32) | output tokens whose bytes are
                                          committed up to that response_len (nginx settles from it) */
    uint8_t  reserved[32];      /* 224 */
};

/* Bytes 384..895 of every slot: the full MinHash signature nginx computed, so the
   engine can estimate Jaccard similarity against cached entries without recomputing. */
struct zccp_slot_signature {
    uint32_t minhash[128];      /*   0 one value per MinHash function (nginx) */
};

/* Bytes 896..1151 of every slot: who asks, and for what (nginx). */
struct zccp_slot_request {
    uint32_t kind;              /*   0 enum zccp_request_kind */
    uint32_t request_id_len;    /*   4 bytes used in request_id */
    uint8_t  request_id[64];    /*   8 X-Request-ID: the caller's, or one nginx made */
    uint8_t  tenant[32];        /*  72 SHA-256 of the tenant's source value (ZCCP_FLAG_TENANT) */
    uint8_t  mask_digest[32];   /* 104 SHA-256 naming the mask set nginx applied (ZCCP_FLAG_MASK_DIGEST) */
    uint8_t  prefix_key[32];    /* 136 fingerprint prefix key: the request but its final message (ZCCP_FLAG_FP_VALID) */
    uint32_t openai_api;        /* 168 enum zccp_openai_api (ZCCP_FLAG_API_OPENAI) */
    uint8_t  trace_id[16];      /* 172 W3C trace id of the client's traceparent (trace_flags bit 8) */
    uint8_t  parent_span_id[8]; /* 188 the client's span id from that traceparent */
    uint32_t trace_flags;       /* 196 the traceparent's flags (bit 0: sampled); bit 8: a traceparent was sent */
    uint64_t nginx_start_ns;    /* 200 CLOCK_REALTIME ns nginx read the request line (ms precision) */
    uint32_t nginx_admit_us;    /* 208 nginx's time from its handler's entry to the fill, in us */
    uint16_t tracestate_len;    /* 212 the client's tracestate (with its traceparent), in the payload
                                       region right after the body: payload_len + this <= payload_cap */
    uint8_t  reserved[42];      /* 214 */
};

/* One L1 hit's span (nginx answered it alone), in a ZCCP_KIND_SPANS payload. */
struct zccp_l1_span {
    uint8_t  trace_id[16];      /*   0 the client's traceparent's (trace_flags bit 8); else the engine starts a trace */
    uint8_t  parent_span_id[8]; /*  16 */
    uint32_t trace_flags;       /*  24 as zccp_slot_request's */
    uint32_t status;            /*  28 the HTTP status nginx answered */
    uint64_t start_ns;          /*  32 CLOCK_REALTIME ns nginx read the request line (ms precision) */
    uint32_t duration_us;       /*  40 from then to the answer written (ms precision) */
    uint32_t api;               /*  44 0 Anthropic, 1 OpenAI */
    uint32_t request_id_len;    /*  48 bytes used in request_id */
    uint8_t  request_id[64];    /*  52 X-Request-ID */
    uint8_t  reserved[12];      /* 116 */
};

/* Doorbell frames: fixed size, host byte order, nothing else travels on the socket. */
struct zccp_ring {
    uint32_t op;                /* ZCCP_OP_RING or ZCCP_OP_PING */
    uint32_t slot;
    uint64_t generation;
};

struct zccp_notice {
    uint32_t op;                /* ZCCP_OP_NOTICE, ZCCP_OP_PONG or ZCCP_OP_REJECT */
    uint32_t slot;
    uint64_t generation;
    uint32_t response_len;      /* cumulative committed bytes */
    uint32_t final;             /* 1 on the last notice of a ring */
    uint32_t status;            /* HTTP status (NOTICE), reject reason as HTTP status (REJECT) */
    uint32_t reserved;
};
