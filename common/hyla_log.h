/* hyla_log.h — leveled logging to stderr. Level from HYLA_LOG=debug|info|warn|error (default info).
 * Two formats: text (default) "HH:MM:SS.mmm prefix level: message", or one JSON object per
 * line for log collectors: {"ts":"2026-01-02T03:04:05.678Z","level":"info","component":"prefix",
 * "msg":"message"} (keys in that order; strings escaped as JSON requires).
 * Thread-safe: each message is one fprintf. */
#ifndef HYLA_LOG_H
#define HYLA_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { HYLA_LOG_DEBUG = 0, HYLA_LOG_INFO, HYLA_LOG_WARN, HYLA_LOG_ERROR, HYLA_LOG_OFF } hyla_log_level;

void hyla_log_set_level(hyla_log_level lvl);
void hyla_log_set_prefix(const char *prefix); /* e.g. "worker w1"; copied */
hyla_log_level hyla_log_get_level(void);
typedef enum { HYLA_LOG_TEXT = 0, HYLA_LOG_JSON = 1 } hyla_log_format;
void hyla_log_set_format(hyla_log_format f);
/* "text" or "json" into *out; 0 for anything else. */
int hyla_log_parse_format(const char *s, hyla_log_format *out);
void hyla_log(hyla_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define HYLA_DEBUG(...) hyla_log(HYLA_LOG_DEBUG, __VA_ARGS__)
#define HYLA_INFO(...) hyla_log(HYLA_LOG_INFO, __VA_ARGS__)
#define HYLA_WARN(...) hyla_log(HYLA_LOG_WARN, __VA_ARGS__)
#define HYLA_ERROR(...) hyla_log(HYLA_LOG_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
