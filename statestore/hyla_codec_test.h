/* hyla_codec_test.h — fault injection into the codec, for tests only (tests/test_store*.c).
 * Not part of the codec's interface: products never call these. Process-wide counters
 * (atomics), so a test that arms one runs it on one thread at a time. */
#ifndef HYLA_CODEC_TEST_H
#define HYLA_CODEC_TEST_H

#ifdef __cplusplus
extern "C" {
#endif

/* Make the nth zstd call from now fail (1 = the next one); 0 disables. */
void hyla_codec_fault_zstd(long nth);
/* Make the nth file write (of hyla_snapshot_save_file) from now fail with ENOSPC; 0 disables. */
void hyla_codec_fault_write(long nth);

#ifdef __cplusplus
}
#endif
#endif
