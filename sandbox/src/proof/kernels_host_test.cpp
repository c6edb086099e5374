// Host harness for kernels.cu (a test of sandbox/src/proof/cuda.rs): compiles the kernels'
// work items as plain C++ and runs them in loops, in the same runs (batches, devices' shares)
// as cuda.rs launches them, with a textbook GEMM in place of cuBLAS. Prints hex lines the
// test compares with the blake3 crate and gridlease_contracts::proof::data.
//
//   hash KEY LEN PREFIX   BLAKE3 (KEY "-": unkeyed, else 64 hex digits) of the input
//                         byte i = i % 251, LEN bytes, the first PREFIX (<= 32) of them as the
//                         message prefix and the rest as word-aligned data: "hash <hex>"
//   challenge SEED N GEMMS ROWS PAGE_BYTES PAGES ROW_BATCH SPLIT PAGE_BATCH
//                         B, A's rows, the row leaves, the fill pages and their leaves:
//                         "bt <hex>", "a <index> <hex>", "leaf <index> <hex>",
//                         "page0 <hex>" (fill page 0), "pageleaf <page> <hex>"; the fill in two
//                         shares [0, SPLIT) and [SPLIT, PAGES) as on two devices

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels.cu"

static void hex(const u8 *p, size_t n) {
  for (size_t i = 0; i < n; i++) std::printf("%02x", p[i]);
}

static void hex_words(const u32 *w, size_t nwords) {
  for (size_t i = 0; i < nwords; i++)
    for (int b = 0; b < 4; b++) std::printf("%02x", (w[i] >> (8 * b)) & 0xff);
}

static bool parse_key(const char *s, u32 *key) {
  if (std::strlen(s) != 64) return false;
  for (int i = 0; i < 32; i++) {
    unsigned v;
    if (std::sscanf(s + 2 * i, "%2x", &v) != 1) return false;
    if (i % 4 == 0) key[i / 4] = 0;
    key[i / 4] |= v << (8 * (i % 4));
  }
  return true;
}

static int cmd_hash(char **argv) {
  u32 key[8];
  u32 flags = 0;
  if (std::strcmp(argv[0], "-") == 0) {
    iv_words(key);
  } else {
    if (!parse_key(argv[0], key)) return 64;
    flags = KEYED_HASH;
  }
  u64 len = std::strtoull(argv[1], 0, 10);
  u32 prefix = (u32)std::strtoul(argv[2], 0, 10);
  if (prefix > 32 || prefix > len) return 64;
  Msg m;
  msg_init(&m);
  for (u32 i = 0; i < prefix; i++) msg_byte(&m, i % 251);
  u64 data_len = len - prefix;
  std::vector<u32> data((data_len + 3) / 4 + 1, 0);
  for (u64 i = 0; i < data_len; i++) {
    u64 b = (prefix + i) % 251;
    data[i / 4] |= (u32)b << (8 * (i % 4));
  }
  m.data = data.data();
  m.data_len = data_len;
  u64 nchunks = msg_chunks(&m);
  std::vector<u32> cvs(nchunks * 8);
  for (u64 ci = 0; ci < nchunks; ci++) chunk_cv(&m, key, flags, ci, nchunks, &cvs[ci * 8]);
  u32 out[8];
  merge_cvs(cvs.data(), nchunks, key, flags, out);
  std::printf("hash ");
  hex_words(out, 8);
  std::printf("\n");
  return 0;
}

static int cmd_challenge(char **argv) {
  u32 key[8];
  if (!parse_key(argv[0], key)) return 64;
  u32 n = (u32)std::strtoul(argv[1], 0, 10);
  u32 gemms = (u32)std::strtoul(argv[2], 0, 10);
  u32 rows = (u32)std::strtoul(argv[3], 0, 10);
  u32 page_bytes = (u32)std::strtoul(argv[4], 0, 10);
  u64 pages = std::strtoull(argv[5], 0, 10);
  u64 row_batch = std::strtoull(argv[6], 0, 10);
  u64 split = std::strtoull(argv[7], 0, 10);
  u64 page_batch = std::strtoull(argv[8], 0, 10);
  if (n == 0 || n % 64 || row_batch == 0 || page_batch == 0 || split > pages || page_bytes % 64)
    return 64;

  // B, transposed, as gen_bt writes it.
  std::vector<u32> bt_words((u64)n * n / 4);
  u8 *bt = (u8 *)bt_words.data();
  for (u64 t = 0; t < (u64)n * n / 64; t++) gen_bt_item(bt, key, n, t);
  std::printf("bt ");
  hex(bt, (u64)n * n);
  std::printf("\n");

  // The rows, in runs of row_batch over the flattened space, as cuda.rs batches them.
  u64 total = (u64)gemms * rows;
  u64 nchunks_row = (23 + 4ull * n + CHUNK_LEN - 1) / CHUNK_LEN;
  for (u64 first = 0; first < total; first += row_batch) {
    u64 count = total - first < row_batch ? total - first : row_batch;
    std::vector<u32> a_words(count * n / 4);
    u8 *a = (u8 *)a_words.data();
    for (u64 t = 0; t < count * (n / 64); t++) gen_a_item(a, key, n, rows, first, t);
    // The product C = A B (cuBLAS's TN call: C[r][j] = sum_k A[r][k] * Bt[j][k]).
    std::vector<i32> c(count * n);
    for (u64 r = 0; r < count; r++)
      for (u64 j = 0; j < n; j++) {
        i32 s = 0;
        for (u64 k = 0; k < n; k++) s += (i32)(i8)a[r * n + k] * (i32)(i8)bt[j * n + k];
        c[r * n + j] = s;
      }
    std::vector<u32> cvs(count * nchunks_row * 8);
    for (u64 t = 0; t < count * nchunks_row; t++)
      row_chunks_item(c.data(), n, rows, first, nchunks_row, cvs.data(), t);
    std::vector<u32> leaves(count * 8);
    for (u64 t = 0; t < count; t++) merge_item(cvs.data(), nchunks_row, leaves.data(), t);
    for (u64 r = 0; r < count; r++) {
      std::printf("a %llu ", first + r);
      hex(a + r * n, n);
      std::printf("\nleaf %llu ", first + r);
      hex_words(&leaves[r * 8], 8);
      std::printf("\n");
    }
  }

  // The fill in two shares, each generated whole, then hashed in runs of page_batch.
  u64 nchunks_page = (28 + (u64)page_bytes + CHUNK_LEN - 1) / CHUNK_LEN;
  u64 shares[2][2] = {{0, split}, {split, pages}};
  for (int d = 0; d < 2; d++) {
    u64 page0 = shares[d][0], count = shares[d][1] - shares[d][0];
    if (count == 0) continue;
    std::vector<u32> fill_words(count * page_bytes / 4);
    u8 *fill = (u8 *)fill_words.data();
    for (u64 t = 0; t < count * (page_bytes / 64); t++)
      gen_pages_item(fill, key, page_bytes, page0, t);
    if (page0 == 0) {
      std::printf("page0 ");
      hex(fill, page_bytes);
      std::printf("\n");
    }
    for (u64 first = 0; first < count; first += page_batch) {
      u64 run = count - first < page_batch ? count - first : page_batch;
      std::vector<u32> cvs(run * nchunks_page * 8);
      for (u64 t = 0; t < run * nchunks_page; t++)
        page_chunks_item(fill, page_bytes, page0, first, nchunks_page, cvs.data(), t);
      std::vector<u32> leaves(run * 8);
      for (u64 t = 0; t < run; t++) merge_item(cvs.data(), nchunks_page, leaves.data(), t);
      for (u64 p = 0; p < run; p++) {
        std::printf("pageleaf %llu ", page0 + first + p);
        hex_words(&leaves[p * 8], 8);
        std::printf("\n");
      }
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && std::strcmp(argv[1], "hash") == 0) return cmd_hash(argv + 2);
  if (argc == 11 && std::strcmp(argv[1], "challenge") == 0) return cmd_challenge(argv + 2);
  std::fprintf(stderr, "usage: see the header of kernels_host_test.cpp\n");
  return 64;
}
