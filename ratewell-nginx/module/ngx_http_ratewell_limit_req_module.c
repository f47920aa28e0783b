/*
 * ngx_http_ratewell_limit_req_module: the drop-in build of ngx_http_ratewell_module.
 *
 * The same module under another name, which also claims limit_req's five directives
 * (limit_req_zone, limit_req, limit_req_status, limit_req_log_level, limit_req_dry_run) and
 * answers as limit_req does by default (503, no fields): `load_module` alone puts ratewell's
 * engine behind an existing limit_req configuration. Its ngx_module_order (module/config)
 * places it before ngx_http_limit_req_module, to which nginx would otherwise give the
 * directives; the tests check that it receives them. Load this module or
 * ngx_http_ratewell_module, not both: both register the $ratewell_* variables, and nginx
 * refuses the second.
 */

#define NGX_HTTP_RATEWELL_DROP_IN  1
#define ngx_http_ratewell_module   ngx_http_ratewell_limit_req_module

#include "ngx_http_ratewell_module.c"
