// gridlease proof of GPU (issue 44): the kernels of the CUDA prover (sandbox/src/proof/cuda.rs),
// compiled at run time with NVRTC. They give exactly the bytes of
// gridlease_contracts::proof::data:
//
//   gen_bt       B (n x n int8) from the seed, written transposed (Bt[j][k] = B[k][j]) for
//                cuBLAS's int8 "TN" GEMM
//   gen_a        rows of A_i, for a run of the flattened (gemm-major) row space
//   row_chunks   BLAKE3 chunk chaining values of each row leaf's message
//                ("gl-proof-v1/row" || gemm || row || the n int32 sums, little-endian)
//   merge        the BLAKE3 tree over a message's chunk values: its hash (the leaf)
//   gen_pages    pages of the VRAM fill, in place
//   page_chunks  chunk chaining values of each page leaf's message
//                ("gl-proof-v1/pageleaf" || page || its bytes)
//
// BLAKE3 here is a straight port of the BLAKE3 reference implementation
// (github.com/BLAKE3-team/BLAKE3, reference_impl/reference_impl.rs): the same compression
// function, chunk state and chaining-value stack, written per chunk so that one thread
// computes one chunk and another merges a message's chunks. It must reproduce the official
// test vectors (test_vectors/test_vectors.json: input byte i = i % 251, lengths 0, 1, 63, 64,
// 65, 1023, 1024, 1025, 2048, 2049, 3072, 3073, 4096, 4097, 8193, 16384, 31744, 102400;
// "hash" unkeyed, "keyed_hash" with key "whats the Elvish word for friend"), e.g. the hash of
// the empty input af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262.
// sandbox/src/proof/cuda.rs's tests compile this file as C++ on the host (the __device__
// functions are plain C++; the __global__ wrappers are left out) and check it against the
// blake3 crate on those inputs and against contracts::proof::data on small challenges.
//
// Every byte order is little-endian, as on the GPU and on x86.

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define GL_FN __device__ __forceinline__
#define GL_ON_GPU 1
#else
#define GL_FN static inline
#endif

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;

#define CHUNK_START 1u
#define CHUNK_END 2u
#define PARENT 4u
#define ROOT 8u
#define KEYED_HASH 16u
#define CHUNK_LEN 1024ull
#define BLOCK_LEN 64u
// Deep enough for 2^32 chunks (a page of 16 MiB has 16 385).
#define CV_STACK 32

#define IV0 0x6A09E667u
#define IV1 0xBB67AE85u
#define IV2 0x3C6EF372u
#define IV3 0xA54FF53Au
#define IV4 0x510E527Fu
#define IV5 0x9B05688Cu
#define IV6 0x1F83D9ABu
#define IV7 0x5BE0CD19u

GL_FN u32 rotr32(u32 w, u32 c) { return (w >> c) | (w << (32u - c)); }

// The mixing function G.
GL_FN void g(u32 *s, int a, int b, int c, int d, u32 mx, u32 my) {
  s[a] = s[a] + s[b] + mx;
  s[d] = rotr32(s[d] ^ s[a], 16);
  s[c] = s[c] + s[d];
  s[b] = rotr32(s[b] ^ s[c], 12);
  s[a] = s[a] + s[b] + my;
  s[d] = rotr32(s[d] ^ s[a], 8);
  s[c] = s[c] + s[d];
  s[b] = rotr32(s[b] ^ s[c], 7);
}

GL_FN void round_fn(u32 *s, const u32 *m) {
  // Columns.
  g(s, 0, 4, 8, 12, m[0], m[1]);
  g(s, 1, 5, 9, 13, m[2], m[3]);
  g(s, 2, 6, 10, 14, m[4], m[5]);
  g(s, 3, 7, 11, 15, m[6], m[7]);
  // Diagonals.
  g(s, 0, 5, 10, 15, m[8], m[9]);
  g(s, 1, 6, 11, 12, m[10], m[11]);
  g(s, 2, 7, 8, 13, m[12], m[13]);
  g(s, 3, 4, 9, 14, m[14], m[15]);
}

// MSG_PERMUTATION = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8]:
// permuted[i] = m[MSG_PERMUTATION[i]].
GL_FN void permute(u32 *m) {
  u32 p0 = m[2], p1 = m[6], p2 = m[3], p3 = m[10], p4 = m[7], p5 = m[0], p6 = m[4],
      p7 = m[13], p8 = m[1], p9 = m[11], p10 = m[12], p11 = m[5], p12 = m[9], p13 = m[14],
      p14 = m[15], p15 = m[8];
  m[0] = p0; m[1] = p1; m[2] = p2; m[3] = p3; m[4] = p4; m[5] = p5; m[6] = p6; m[7] = p7;
  m[8] = p8; m[9] = p9; m[10] = p10; m[11] = p11; m[12] = p12; m[13] = p13; m[14] = p14;
  m[15] = p15;
}

// The compression function: all 16 output words (the first 8 are the chaining value).
GL_FN void compress(const u32 *cv, const u32 *block_words, u64 counter, u32 block_len,
                    u32 flags, u32 *out) {
  u32 s[16] = {cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7],
               IV0,   IV1,   IV2,   IV3,   (u32)counter, (u32)(counter >> 32), block_len, flags};
  u32 m[16];
  for (int i = 0; i < 16; i++) m[i] = block_words[i];
  round_fn(s, m); permute(m);  // round 1
  round_fn(s, m); permute(m);  // round 2
  round_fn(s, m); permute(m);  // round 3
  round_fn(s, m); permute(m);  // round 4
  round_fn(s, m); permute(m);  // round 5
  round_fn(s, m); permute(m);  // round 6
  round_fn(s, m);              // round 7
  for (int i = 0; i < 8; i++) {
    out[i] = s[i] ^ s[i + 8];
    out[i + 8] = s[i + 8] ^ cv[i];
  }
}

GL_FN void iv_words(u32 *k) {
  k[0] = IV0; k[1] = IV1; k[2] = IV2; k[3] = IV3; k[4] = IV4; k[5] = IV5; k[6] = IV6; k[7] = IV7;
}

// ---- Messages: a short prefix (at most 32 bytes, packed little-endian into words) followed by
// data in device memory, read as 32-bit words (its start 4-byte aligned, its length a
// multiple of 4).

struct Msg {
  u32 prefix[8];
  u32 prefix_len;
  const u32 *data;
  u64 data_len;
};

GL_FN void msg_init(Msg *m) {
  for (int i = 0; i < 8; i++) m->prefix[i] = 0;
  m->prefix_len = 0;
  m->data = 0;
  m->data_len = 0;
}

GL_FN void msg_byte(Msg *m, u32 b) {
  m->prefix[m->prefix_len >> 2] |= (b & 0xffu) << (8u * (m->prefix_len & 3u));
  m->prefix_len += 1;
}

GL_FN void msg_str(Msg *m, const char *s) {
  for (; *s; s++) msg_byte(m, (u32)(u8)*s);
}

GL_FN void msg_u32(Msg *m, u32 v) {
  for (int i = 0; i < 4; i++) msg_byte(m, v >> (8 * i));
}

GL_FN void msg_u64(Msg *m, u64 v) {
  for (int i = 0; i < 8; i++) msg_byte(m, (u32)(v >> (8 * i)));
}

GL_FN u64 msg_len(const Msg *m) { return (u64)m->prefix_len + m->data_len; }

GL_FN u32 msg_get_byte(const Msg *m, u64 i) {
  if (i < m->prefix_len) return (m->prefix[i >> 2] >> (8u * (u32)(i & 3u))) & 0xffu;
  u64 d = i - m->prefix_len;
  if (d < m->data_len) return (m->data[d >> 2] >> (8u * (u32)(d & 3u))) & 0xffu;
  return 0;
}

// The message's little-endian word at byte offset `pos` (a multiple of 4); bytes past the end
// are zero (a last block's padding).
GL_FN u32 msg_word(const Msg *m, u64 pos) {
  u64 len = msg_len(m);
  if (pos >= m->prefix_len && pos + 4 <= len) {
    u64 d = pos - m->prefix_len;
    u64 idx = d >> 2;
    u32 shift = 8u * (u32)(d & 3u);
    if (shift == 0) return m->data[idx];
    // The four bytes straddle two data words, both inside the data.
    return (m->data[idx] >> shift) | (m->data[idx + 1] << (32u - shift));
  }
  u32 w = 0;
  for (u32 j = 0; j < 4; j++) w |= msg_get_byte(m, pos + j) << (8u * j);
  return w;
}

// Chunks of a message (an empty message has one, empty).
GL_FN u64 msg_chunks(const Msg *m) {
  u64 len = msg_len(m);
  return len == 0 ? 1 : (len + CHUNK_LEN - 1) / CHUNK_LEN;
}

// The chaining value of chunk `ci` of `m` (of `nchunks`), as the reference's ChunkState
// computes it: its blocks compressed in turn from the key, CHUNK_START on the first, CHUNK_END
// on the last. When the message is one chunk, its last block also gets ROOT and `out` is the
// message's hash.
GL_FN void chunk_cv(const Msg *m, const u32 *key, u32 flags, u64 ci, u64 nchunks, u32 *out) {
  u64 len = msg_len(m);
  u64 start = ci * CHUNK_LEN;
  u64 chunk_len = len - start < CHUNK_LEN ? len - start : CHUNK_LEN;
  u32 nblocks = chunk_len == 0 ? 1u : (u32)((chunk_len + BLOCK_LEN - 1) / BLOCK_LEN);
  u32 cv[8];
  for (int i = 0; i < 8; i++) cv[i] = key[i];
  u32 block[16];
  u32 full[16];
  for (u32 b = 0; b < nblocks; b++) {
    u64 at = start + (u64)b * BLOCK_LEN;
    u64 rest = chunk_len - (u64)b * BLOCK_LEN;
    u32 block_len = rest < BLOCK_LEN ? (u32)rest : BLOCK_LEN;
    for (u32 w = 0; w < 16; w++) block[w] = msg_word(m, at + 4u * w);
    u32 f = flags;
    if (b == 0) f |= CHUNK_START;
    if (b == nblocks - 1) {
      f |= CHUNK_END;
      if (nchunks == 1) f |= ROOT;
    }
    compress(cv, block, ci, block_len, f, full);
    for (int i = 0; i < 8; i++) cv[i] = full[i];
  }
  for (int i = 0; i < 8; i++) out[i] = cv[i];
}

// A parent node's output words 0..7 (its chaining value, or the hash with ROOT).
GL_FN void parent_cv(const u32 *left, const u32 *right, const u32 *key, u32 flags, u32 *out) {
  u32 block[16];
  for (int i = 0; i < 8; i++) {
    block[i] = left[i];
    block[i + 8] = right[i];
  }
  u32 full[16];
  compress(key, block, 0, BLOCK_LEN, flags | PARENT, full);
  for (int i = 0; i < 8; i++) out[i] = full[i];
}

// The hash of a message from its chunks' chaining values (`cvs`: nchunks x 8 words, the
// last chunk's without ROOT unless it is the only one), as the reference's Hasher does: each
// chunk but the last pushed with add_chunk_chaining_value (merging while the chunk count has
// trailing zeros), then the last chunk's value folded into the stack from the top, the final
// parent with ROOT.
GL_FN void merge_cvs(const u32 *cvs, u64 nchunks, const u32 *key, u32 flags, u32 *out) {
  if (nchunks == 1) {
    for (int i = 0; i < 8; i++) out[i] = cvs[i];
    return;
  }
  u32 stack[CV_STACK][8];
  int sp = 0;
  u32 cur[8];
  for (u64 c = 0; c + 1 < nchunks; c++) {
    for (int i = 0; i < 8; i++) cur[i] = cvs[c * 8 + i];
    u64 total = c + 1;
    while ((total & 1) == 0) {
      sp -= 1;
      parent_cv(stack[sp], cur, key, flags, cur);
      total >>= 1;
    }
    for (int i = 0; i < 8; i++) stack[sp][i] = cur[i];
    sp += 1;
  }
  for (int i = 0; i < 8; i++) cur[i] = cvs[(nchunks - 1) * 8 + i];
  while (sp > 0) {
    sp -= 1;
    parent_cv(stack[sp], cur, key, sp == 0 ? (flags | ROOT) : flags, cur);
  }
  for (int i = 0; i < 8; i++) out[i] = cur[i];
}

// Output block `counter` (64 bytes, 16 words) of the keyed XOF of a message of one block (at
// most 64 bytes: every seeded stream's input is).
GL_FN void xof_block(const Msg *m, const u32 *key, u64 counter, u32 *out) {
  u32 block[16];
  for (u32 w = 0; w < 16; w++) block[w] = msg_word(m, 4u * w);
  compress(key, block, counter, (u32)msg_len(m), KEYED_HASH | CHUNK_START | CHUNK_END | ROOT,
           out);
}

// ---- The seeded streams and the leaves, one work item each (the __global__ wrappers below
// run them over a grid; the host test runs them in loops).

// Item t of gen_bt: output block t of B's stream (bytes 64t..64t+63 of B in row-major order),
// stored transposed: B[k][j] (byte k*n + j) goes to bt[j*n + k].
GL_FN void gen_bt_item(u8 *bt, const u32 *key, u32 n, u64 t) {
  Msg m;
  msg_init(&m);
  msg_str(&m, "gl-proof-v1/B");
  msg_u32(&m, n);
  u32 out[16];
  xof_block(&m, key, t, out);
  for (u32 i = 0; i < 64; i++) {
    u64 x = t * 64 + i;
    u64 k = x / n, j = x % n;
    bt[j * n + k] = (u8)(out[i >> 2] >> (8u * (i & 3u)));
  }
}

// Item t of gen_a: block (t mod n/64) of row `first + t / (n/64)` of the flattened row space
// (gemm = index / rows, row = index mod rows), into a[(t / (n/64)) * n ...] (row-major).
GL_FN void gen_a_item(u8 *a, const u32 *key, u32 n, u32 rows, u64 first, u64 t) {
  u64 per_row = n / 64;
  u64 r = t / per_row, q = t % per_row;
  u64 index = first + r;
  Msg m;
  msg_init(&m);
  msg_str(&m, "gl-proof-v1/A");
  msg_u32(&m, n);
  msg_u32(&m, (u32)(index / rows));
  msg_u32(&m, (u32)(index % rows));
  u32 out[16];
  xof_block(&m, key, q, out);
  u32 *dst = (u32 *)(a + r * n + q * 64);
  for (int i = 0; i < 16; i++) dst[i] = out[i];
}

// Item t of row_chunks: chunk (t mod nchunks) of the leaf message of local row t / nchunks
// (the C rows of a run, row-major, n int32 each, flattened index first + local row).
GL_FN void row_chunks_item(const i32 *c, u32 n, u32 rows, u64 first, u64 nchunks, u32 *cvs,
                           u64 t) {
  u64 r = t / nchunks, ci = t % nchunks;
  u64 index = first + r;
  Msg m;
  msg_init(&m);
  msg_str(&m, "gl-proof-v1/row");
  msg_u32(&m, (u32)(index / rows));
  msg_u32(&m, (u32)(index % rows));
  m.data = (const u32 *)(c + r * n);
  m.data_len = 4ull * n;
  u32 key[8];
  iv_words(key);
  chunk_cv(&m, key, 0, ci, nchunks, cvs + t * 8);
}

// Item t of merge: the hash of message t from its nchunks chunk values.
GL_FN void merge_item(const u32 *cvs, u64 nchunks, u32 *leaves, u64 t) {
  u32 key[8];
  iv_words(key);
  merge_cvs(cvs + t * nchunks * 8, nchunks, key, 0, leaves + t * 8);
}

// Item t of gen_pages: block (t mod page_bytes/64) of fill page t / (page_bytes/64), whose
// index in the whole fill is page0 + that.
GL_FN void gen_pages_item(u8 *fill, const u32 *key, u32 page_bytes, u64 page0, u64 t) {
  u64 per_page = page_bytes / 64;
  u64 lp = t / per_page, q = t % per_page;
  Msg m;
  msg_init(&m);
  msg_str(&m, "gl-proof-v1/page");
  msg_u32(&m, page_bytes);
  msg_u64(&m, page0 + lp);
  u32 out[16];
  xof_block(&m, key, q, out);
  u32 *dst = (u32 *)(fill + lp * page_bytes + q * 64);
  for (int i = 0; i < 16; i++) dst[i] = out[i];
}

// Item t of page_chunks: chunk (t mod nchunks) of the leaf message of fill page
// first + t / nchunks (index page0 + that in the whole fill).
GL_FN void page_chunks_item(const u8 *fill, u32 page_bytes, u64 page0, u64 first, u64 nchunks,
                            u32 *cvs, u64 t) {
  u64 lp = first + t / nchunks, ci = t % nchunks;
  Msg m;
  msg_init(&m);
  msg_str(&m, "gl-proof-v1/pageleaf");
  msg_u64(&m, page0 + lp);
  m.data = (const u32 *)(fill + lp * page_bytes);
  m.data_len = page_bytes;
  u32 key[8];
  iv_words(key);
  chunk_cv(&m, key, 0, ci, nchunks, cvs + t * 8);
}

#ifdef GL_ON_GPU
// Grid-stride loops over `items` work items.
#define GL_EACH(t, items)                                                              \
  for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < (items);                \
       t += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void gen_bt(u8 *bt, const u32 *key, u32 n, u64 items) {
  GL_EACH(t, items) gen_bt_item(bt, key, n, t);
}

extern "C" __global__ void gen_a(u8 *a, const u32 *key, u32 n, u32 rows, u64 first, u64 items) {
  GL_EACH(t, items) gen_a_item(a, key, n, rows, first, t);
}

extern "C" __global__ void row_chunks(const i32 *c, u32 n, u32 rows, u64 first, u64 nchunks,
                                      u32 *cvs, u64 items) {
  GL_EACH(t, items) row_chunks_item(c, n, rows, first, nchunks, cvs, t);
}

extern "C" __global__ void merge(const u32 *cvs, u64 nchunks, u32 *leaves, u64 items) {
  GL_EACH(t, items) merge_item(cvs, nchunks, leaves, t);
}

extern "C" __global__ void gen_pages(u8 *fill, const u32 *key, u32 page_bytes, u64 page0,
                                     u64 items) {
  GL_EACH(t, items) gen_pages_item(fill, key, page_bytes, page0, t);
}

extern "C" __global__ void page_chunks(const u8 *fill, u32 page_bytes, u64 page0, u64 first,
                                       u64 nchunks, u32 *cvs, u64 items) {
  GL_EACH(t, items) page_chunks_item(fill, page_bytes, page0, first, nchunks, cvs, t);
}
#endif
