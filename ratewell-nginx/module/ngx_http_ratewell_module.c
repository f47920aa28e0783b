/*
 * ngx_http_ratewell_module: ratewell's decisions in nginx's preaccess phase, on the engine's
 * shared key table beside an nginx shared zone, exact across every worker.
 *
 * The decisions are the Rust half's (libratewell_nginx.a, include/ratewell_nginx.h): this file
 * parses the directives, lays the table out in a memory file of the zone's (which a binary
 * upgrade's new master takes over), opens it in each worker, computes each request's keys,
 * delays or answers the request as the decision says, sets the variables, counts outcomes in
 * the zone, serves the counters, and saves and restores a zone's state.
 *
 * The directives are limit_req's five, renamed (limit_req_zone -> ratewell_zone, limit_req ->
 * ratewell, limit_req_status, limit_req_log_level and limit_req_dry_run -> ratewell_*), and a
 * zone may name any policy of the engine's grammar instead of limit_req's rate.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ratewell_nginx.h"

#if (NGX_LINUX)
#include <sys/mman.h>
#endif


/* 1 in the drop-in build (ngx_http_ratewell_limit_req_module.c). */
#ifndef NGX_HTTP_RATEWELL_DROP_IN
#define NGX_HTTP_RATEWELL_DROP_IN  0
#endif


#define NGX_HTTP_RATEWELL_ERR_LEN       512

/* A location's delay before every zone is known: the zone's own burst and delay. */
#define NGX_HTTP_RATEWELL_ZONES_OWN     -2

/* The environment variable that hands a binary upgrade's new master the descriptors of the
 * zones' tables ("RATEWELL_NGINX_TABLES=5;7;"), as nginx hands it the listening sockets. */
#define NGX_HTTP_RATEWELL_TABLES_VAR    "RATEWELL_NGINX_TABLES"
#define NGX_HTTP_RATEWELL_MAX_INHERITED 256
/* "RWTABLE1": the first word of a table file's identity. */
#define NGX_HTTP_RATEWELL_TABLE_MAGIC   0x31454c4241545752ULL

/* limit_req's values of r->main->limit_req_status (what $limit_req_status reads). */
#define NGX_HTTP_RATEWELL_PASSED            1
#define NGX_HTTP_RATEWELL_DELAYED           2
#define NGX_HTTP_RATEWELL_REJECTED          3
#define NGX_HTTP_RATEWELL_DELAYED_DRY_RUN   4
#define NGX_HTTP_RATEWELL_REJECTED_DRY_RUN  5


/* What the zone keeps across reloads: where the table is in it, and the counters of every
 * worker's requests. */
typedef struct {
    void                        *region;
    size_t                       len;
    size_t                       capacity;
    ngx_atomic_t                 admitted;
    ngx_atomic_t                 rejected;
    ngx_atomic_t                 delayed;
    ngx_atomic_t                 dry_run_rejected;
    ngx_atomic_t                 dry_run_delayed;
} ngx_http_ratewell_shctx_t;


/* A zone's table in a memory file of its own (memfd, on Linux), not closed on exec: a binary
 * upgrade's new master inherits the file and maps it, so both generations decide on one table.
 * The file starts with the zone's identity (ngx_http_ratewell_identity_t, then the zone's name,
 * key and policy), the table after it at `offset`. */
typedef struct {
    int                          fd;
    u_char                      *addr;
    size_t                       size;
    size_t                       offset;
    /* The cycles of this process whose zone uses the table: the last to go unmaps it. */
    ngx_uint_t                   refs;
} ngx_http_ratewell_table_t;


typedef struct {
    uint64_t                     magic;
    uint64_t                     len;
    uint64_t                     capacity;
    uint64_t                     refuse;
    uint64_t                     name_len;
    uint64_t                     key_len;
    uint64_t                     policy_len;
} ngx_http_ratewell_identity_t;


/* One ratewell_zone: its key, policy and table. */
typedef struct {
    ngx_http_complex_value_t     key;
    /* The key's variable when the key is one variable and nothing else ($binary_remote_addr),
     * read without the script engine's copy; else NGX_ERROR. */
    ngx_int_t                    key_index;
    ngx_str_t                    name;
    ngx_str_t                    policy;
    /* The policy's burst when it is a leaky bucket, else -1. */
    int64_t                      burst;
    /* Declared with limit_req's rate=: a location without burst= decides at burst 0. */
    ngx_uint_t                   rate;
    ngx_uint_t                   refuse;
    ngx_str_t                    state;
    ngx_cycle_t                 *cycle;
    ngx_shm_zone_t              *shm_zone;
    ngx_http_ratewell_shctx_t   *sh;
    /* The table's memory file in this process; NULL when the table is in the zone (no memfd). */
    ngx_http_ratewell_table_t   *table;
    /* This worker's handle on the table. */
    ratewell_zone               *zone;
} ngx_http_ratewell_ctx_t;


/* One `ratewell zone=NAME [burst=N] [nodelay | delay=N]`. */
typedef struct {
    ngx_shm_zone_t              *shm_zone;
    /* The location's burst (-1: the zone's own burst and delay) and delay (-1: nodelay). */
    int64_t                      burst;
    int64_t                      delay;
    /* This worker's RateLimit-Policy item for the zone at this burst. */
    ngx_str_t                    policy_field;
    /* Where the directive is, for the messages of the checks made once every zone is known. */
    ngx_str_t                    file;
    ngx_uint_t                   line;
} ngx_http_ratewell_limit_t;


typedef struct {
    ngx_array_t                  zones;     /* of ngx_http_ratewell_ctx_t * */
    ngx_array_t                  limits;    /* of ngx_http_ratewell_limit_t * */
} ngx_http_ratewell_main_conf_t;


typedef struct {
    ngx_array_t                 *limits;    /* of ngx_http_ratewell_limit_t * */
    ngx_uint_t                   status;
    ngx_uint_t                   log_level;
    ngx_uint_t                   delay_log_level;
    ngx_flag_t                   dry_run;
    ngx_flag_t                   headers;
} ngx_http_ratewell_loc_conf_t;


/* Kept on the main request once it is decided (its context, and a pool cleanup, which an
 * internal redirect keeps where it clears the context): a request is decided once, whatever
 * redirects and subrequests it makes; the variables read it. */
typedef struct {
    ngx_uint_t                   status;        /* 0, or NGX_HTTP_RATEWELL_* */
    uint64_t                     remaining;
    /* Whole seconds to wait, when rejected and a wait lets it through; else -1. */
    int64_t                      retry_after;
} ngx_http_ratewell_req_t;


static ngx_int_t ngx_http_ratewell_handler(ngx_http_request_t *r);
static void ngx_http_ratewell_delay(ngx_http_request_t *r);
static void ngx_http_ratewell_cleanup(void *data);
static ngx_int_t ngx_http_ratewell_metrics_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_ratewell_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static ratewell_zone *ngx_http_ratewell_open(ngx_http_ratewell_ctx_t *ctx,
    u_char err[NGX_HTTP_RATEWELL_ERR_LEN]);
static ngx_int_t ngx_http_ratewell_add_variables(ngx_conf_t *cf);
static ngx_int_t ngx_http_ratewell_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static void *ngx_http_ratewell_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_ratewell_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_ratewell_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_ratewell_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_ratewell(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_ratewell_metrics(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_int_t ngx_http_ratewell_init(ngx_conf_t *cf);
static ngx_int_t ngx_http_ratewell_table_place(ngx_http_ratewell_ctx_t *ctx,
    ngx_slab_pool_t *shpool, ngx_uint_t adopt, ngx_log_t *log);
static ngx_int_t ngx_http_ratewell_table_keep(ngx_http_ratewell_ctx_t *ctx,
    ngx_http_ratewell_table_t *t);
static void ngx_http_ratewell_table_release(void *data);
static void ngx_http_ratewell_table_free(ngx_http_ratewell_table_t *t);
#if (NGX_LINUX)
static ngx_http_ratewell_table_t *ngx_http_ratewell_table_inherited(
    ngx_http_ratewell_ctx_t *ctx, ngx_log_t *log);
static ngx_http_ratewell_table_t *ngx_http_ratewell_table_create(
    ngx_http_ratewell_ctx_t *ctx, ngx_log_t *log);
#endif
static ngx_int_t ngx_http_ratewell_init_module(ngx_cycle_t *cycle);
static ngx_int_t ngx_http_ratewell_init_process(ngx_cycle_t *cycle);
static void ngx_http_ratewell_exit_process(ngx_cycle_t *cycle);
static void ngx_http_ratewell_exit_master(ngx_cycle_t *cycle);


static ngx_conf_enum_t  ngx_http_ratewell_log_levels[] = {
    { ngx_string("info"), NGX_LOG_INFO },
    { ngx_string("notice"), NGX_LOG_NOTICE },
    { ngx_string("warn"), NGX_LOG_WARN },
    { ngx_string("error"), NGX_LOG_ERR },
    { ngx_null_string, 0 }
};


static ngx_conf_num_bounds_t  ngx_http_ratewell_status_bounds = {
    ngx_conf_check_num_bounds, 400, 599
};


static ngx_command_t  ngx_http_ratewell_commands[] = {

    { ngx_string("ratewell_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_2MORE,
      ngx_http_ratewell_zone,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("ratewell"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_ratewell,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("ratewell_status"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, status),
      &ngx_http_ratewell_status_bounds },

    { ngx_string("ratewell_log_level"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, log_level),
      &ngx_http_ratewell_log_levels },

    { ngx_string("ratewell_dry_run"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, dry_run),
      NULL },

    { ngx_string("ratewell_headers"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, headers),
      NULL },

    { ngx_string("ratewell_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_ratewell_metrics,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

#if (NGX_HTTP_RATEWELL_DROP_IN)

    /* The drop-in build (ngx_http_ratewell_limit_req_module.c) also claims limit_req's five
     * directives, with the grammar of the ratewell ones they name: its ngx_module_order puts
     * it before ngx_http_limit_req_module, and nginx gives a directive to the first module
     * that declares it. */

    { ngx_string("limit_req_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_2MORE,
      ngx_http_ratewell_zone,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("limit_req"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_ratewell,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("limit_req_status"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, status),
      &ngx_http_ratewell_status_bounds },

    { ngx_string("limit_req_log_level"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, log_level),
      &ngx_http_ratewell_log_levels },

    { ngx_string("limit_req_dry_run"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_ratewell_loc_conf_t, dry_run),
      NULL },

#endif

      ngx_null_command
};


static ngx_http_module_t  ngx_http_ratewell_module_ctx = {
    ngx_http_ratewell_add_variables,       /* preconfiguration */
    ngx_http_ratewell_init,                /* postconfiguration */

    ngx_http_ratewell_create_main_conf,    /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_ratewell_create_loc_conf,     /* create location configuration */
    ngx_http_ratewell_merge_loc_conf       /* merge location configuration */
};


ngx_module_t  ngx_http_ratewell_module = {
    NGX_MODULE_V1,
    &ngx_http_ratewell_module_ctx,         /* module context */
    ngx_http_ratewell_commands,            /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    ngx_http_ratewell_init_module,         /* init module */
    ngx_http_ratewell_init_process,        /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_ratewell_exit_process,        /* exit process */
    ngx_http_ratewell_exit_master,         /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_str_t  ngx_http_ratewell_retry_after = ngx_string("Retry-After");
static ngx_str_t  ngx_http_ratewell_policy_name = ngx_string("RateLimit-Policy");
static ngx_str_t  ngx_http_ratewell_field_name = ngx_string("RateLimit");


/* $ratewell_status's values, limit_req's five (index: NGX_HTTP_RATEWELL_* - 1). */
static ngx_str_t  ngx_http_ratewell_statuses[] = {
    ngx_string("PASSED"),
    ngx_string("DELAYED"),
    ngx_string("REJECTED"),
    ngx_string("DELAYED_DRY_RUN"),
    ngx_string("REJECTED_DRY_RUN")
};


static ngx_http_variable_t  ngx_http_ratewell_vars[] = {

    { ngx_string("ratewell_status"), NULL,
      ngx_http_ratewell_variable, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("ratewell_remaining"), NULL,
      ngx_http_ratewell_variable, 1, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("ratewell_retry_after"), NULL,
      ngx_http_ratewell_variable, 2, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


static ngx_int_t
ngx_http_ratewell_add_header(ngx_http_request_t *r, ngx_str_t *name,
    u_char *value, size_t len)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key = *name;
    h->value.data = value;
    h->value.len = len;
    h->lowcase_key = NULL;
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    return NGX_OK;
}


/* Nothing to free: the cleanup marks the request as decided. */
static void
ngx_http_ratewell_cleanup(void *data)
{
}


static ngx_inline ngx_http_ratewell_req_t *
ngx_http_ratewell_decided(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t       *cln;
    ngx_http_ratewell_req_t  *req;

    req = ngx_http_get_module_ctx(r, ngx_http_ratewell_module);
    if (req != NULL || !r->internal) {
        return req;
    }

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_ratewell_cleanup) {
            req = cln->data;
            ngx_http_set_ctx(r, req, ngx_http_ratewell_module);
            return req;
        }
    }

    return NULL;
}


static void
ngx_http_ratewell_set_status(ngx_http_request_t *r,
    ngx_http_ratewell_req_t *req, ngx_uint_t status)
{
    req->status = status;
    /* The field $limit_req_status reads, so that log formats written for limit_req work. */
    r->main->limit_req_status = status;
}


/* The request's state, with its pool cleanup in one allocation (ngx_pool_cleanup_add makes
 * two), linked into the main request's pool as ngx_pool_cleanup_add links one: the mark that
 * the request is decided, which an internal redirect keeps. */
static ngx_inline ngx_http_ratewell_req_t *
ngx_http_ratewell_start(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t       *cln;
    ngx_http_ratewell_req_t  *req;

    cln = ngx_palloc(r->main->pool,
                     sizeof(ngx_pool_cleanup_t) + sizeof(ngx_http_ratewell_req_t));
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_ratewell_cleanup;
    cln->data = cln + 1;
    cln->next = r->main->pool->cleanup;
    r->main->pool->cleanup = cln;

    req = cln->data;
    req->status = 0;
    req->remaining = 0;
    req->retry_after = -1;
    ngx_http_set_ctx(r->main, req, ngx_http_ratewell_module);

    return req;
}


/* The request's key in the zone: NGX_OK with the key (empty: the zone does not limit it),
 * NGX_ERROR when the zone is not open or the key cannot be evaluated. */
static ngx_inline ngx_int_t
ngx_http_ratewell_key(ngx_http_request_t *r, ngx_http_ratewell_ctx_t *ctx, ngx_str_t *key)
{
    ngx_http_variable_value_t  *vv;

    if (ctx->zone == NULL) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "ratewell_zone \"%V\" is not open in this worker",
                      &ctx->name);
        return NGX_ERROR;
    }

    if (ctx->key_index != NGX_ERROR) {
        /* As the complex value would give it, without its copy: a variable not found is the
         * empty key. */
        vv = ngx_http_get_flushed_variable(r, ctx->key_index);
        if (vv == NULL) {
            return NGX_ERROR;
        }

        key->data = vv->data;
        key->len = vv->not_found ? 0 : vv->len;
        return NGX_OK;
    }

    return ngx_http_complex_value(r, &ctx->key, key);
}


static ngx_int_t ngx_http_ratewell_verdict(ngx_http_request_t *r,
    ngx_http_ratewell_loc_conf_t *lcf, ngx_http_ratewell_req_t *req,
    ratewell_verdict *verdict, ngx_http_ratewell_ctx_t **asked, ngx_uint_t n);


/* A location of one zone that sends no fields, the most common: no arrays, no field buffers,
 * and the engine's one-zone call. */
static ngx_int_t
ngx_http_ratewell_one(ngx_http_request_t *r, ngx_http_ratewell_loc_conf_t *lcf)
{
    ngx_str_t                   key;
    ratewell_ask                ask;
    ratewell_verdict            verdict;
    ngx_http_ratewell_ctx_t    *ctx;
    ngx_http_ratewell_req_t    *req;
    ngx_http_ratewell_limit_t  *limit;

    req = ngx_http_ratewell_start(r);
    if (req == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    limit = ((ngx_http_ratewell_limit_t **) lcf->limits->elts)[0];
    ctx = limit->shm_zone->data;

    if (ngx_http_ratewell_key(r, ctx, &key) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* As limit_req: a request whose key is empty is not limited by the zone. */
    if (key.len == 0) {
        return NGX_DECLINED;
    }

    ask.zone = ctx->zone;
    ask.key = key.data;
    ask.key_len = key.len;
    ask.burst = limit->burst;
    ask.delay = limit->delay;

    if (ratewell_decide_one(&ask, 1, &verdict) != 0) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "ratewell could not decide the request");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    req->remaining = verdict.remaining;

    /* Admitted without a delay, as most requests are: done here. */
    if (verdict.admitted && verdict.delay_ns == 0) {
        (void) ngx_atomic_fetch_add(&ctx->sh->admitted, 1);
        ngx_http_ratewell_set_status(r, req, NGX_HTTP_RATEWELL_PASSED);
        return NGX_DECLINED;
    }

    return ngx_http_ratewell_verdict(r, lcf, req, &verdict, &ctx, 1);
}


static ngx_int_t
ngx_http_ratewell_handler(ngx_http_request_t *r)
{
    u_char                        *fields, *policy, *p;
    size_t                         cap, policy_len;
    ngx_str_t                      key;
    ngx_uint_t                     i, n;
    ratewell_ask                  *asks, asks_kept[8];
    ngx_http_ratewell_ctx_t       *ctx, **asked, *asked_kept[8];
    ngx_http_ratewell_req_t       *req;
    ngx_http_ratewell_limit_t    **limits, **used, *used_kept[8];
    ngx_http_ratewell_loc_conf_t  *lcf;
    ratewell_verdict               verdict;

    if (ngx_http_ratewell_decided(r->main) != NULL) {
        return NGX_DECLINED;
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_ratewell_module);
    if (lcf->limits == NULL || lcf->limits->nelts == 0) {
        return NGX_DECLINED;
    }

    n = lcf->limits->nelts;
    if (n == 1 && !lcf->headers) {
        return ngx_http_ratewell_one(r, lcf);
    }

    req = ngx_http_ratewell_start(r);
    if (req == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* A location names a few zones: up to eight on the stack, more in the pool. */
    if (n <= 8) {
        asks = asks_kept;
        asked = asked_kept;
        used = used_kept;

    } else {
        asks = ngx_palloc(r->pool, n * sizeof(ratewell_ask));
        asked = ngx_palloc(r->pool, n * sizeof(ngx_http_ratewell_ctx_t *));
        used = ngx_palloc(r->pool, n * sizeof(ngx_http_ratewell_limit_t *));
        if (asks == NULL || asked == NULL || used == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    limits = lcf->limits->elts;
    cap = 0;
    policy_len = 0;
    n = 0;

    for (i = 0; i < lcf->limits->nelts; i++) {
        ctx = limits[i]->shm_zone->data;

        if (ngx_http_ratewell_key(r, ctx, &key) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        /* As limit_req: a request whose key is empty is not limited by the zone. */
        if (key.len == 0) {
            continue;
        }

        asks[n].zone = ctx->zone;
        asks[n].key = key.data;
        asks[n].key_len = key.len;
        asks[n].burst = limits[i]->burst;
        asks[n].delay = limits[i]->delay;
        asked[n] = ctx;
        used[n] = limits[i];
        n++;

        if (lcf->headers) {
            /* A field: the name as a string (each byte escaped at most once), then ";r="
             * and ";t=" with at most 15 digits each, and ", " between fields. */
            cap += 2 * ctx->name.len + 48;
            policy_len += limits[i]->policy_field.len + 2;
        }
    }

    if (n == 0) {
        return NGX_DECLINED;
    }

    /* Without headers, the engine writes no RateLimit field. */
    if (lcf->headers) {
        fields = ngx_pnalloc(r->pool, cap);
        if (fields == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

    } else {
        fields = NULL;
        cap = 0;
    }

    if (ratewell_decide(asks, n, 1, fields, cap, &verdict) != 0) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "ratewell could not decide the request");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    req->remaining = verdict.remaining;

    if (lcf->headers) {
        policy = ngx_pnalloc(r->pool, policy_len);
        if (policy == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        p = policy;
        for (i = 0; i < n; i++) {
            if (i > 0) {
                *p++ = ','; *p++ = ' ';
            }
            p = ngx_cpymem(p, used[i]->policy_field.data,
                           used[i]->policy_field.len);
        }

        if (ngx_http_ratewell_add_header(r, &ngx_http_ratewell_policy_name,
                                         policy, p - policy)
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (verdict.fields_len <= cap
            && ngx_http_ratewell_add_header(r, &ngx_http_ratewell_field_name,
                                            fields, verdict.fields_len)
               != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    return ngx_http_ratewell_verdict(r, lcf, req, &verdict, asked, n);
}


/* What follows a decision: the counters, the status, a delay or the rejection. */
static ngx_int_t
ngx_http_ratewell_verdict(ngx_http_request_t *r, ngx_http_ratewell_loc_conf_t *lcf,
    ngx_http_ratewell_req_t *req, ratewell_verdict *verdict, ngx_http_ratewell_ctx_t **asked,
    ngx_uint_t n)
{
    u_char                   *p;
    uint64_t                  seconds;
    ngx_msec_t                delay;
    ngx_uint_t                i;
    ngx_http_ratewell_ctx_t  *ctx;

    if (verdict->admitted) {
        for (i = 0; i < n; i++) {
            (void) ngx_atomic_fetch_add(&asked[i]->sh->admitted, 1);
        }

        if (verdict->delay_ns == 0) {
            ngx_http_ratewell_set_status(r, req, NGX_HTTP_RATEWELL_PASSED);
            return NGX_DECLINED;
        }

        /* nginx's timers are whole milliseconds: a delay is rounded up to one. */
        delay = (ngx_msec_t) (verdict->delay_ns / 1000000
                              + (verdict->delay_ns % 1000000 != 0));

        ctx = asked[verdict->delayed_by < n ? verdict->delayed_by : 0];

        if (lcf->dry_run) {
            (void) ngx_atomic_fetch_add(&ctx->sh->dry_run_delayed, 1);
            ngx_log_error(lcf->delay_log_level, r->connection->log, 0,
                          "delaying request, dry run, by %M ms, "
                          "by ratewell zone \"%V\"", delay, &ctx->name);
            ngx_http_ratewell_set_status(r, req,
                                         NGX_HTTP_RATEWELL_DELAYED_DRY_RUN);
            return NGX_DECLINED;
        }

        (void) ngx_atomic_fetch_add(&ctx->sh->delayed, 1);
        ngx_log_error(lcf->delay_log_level, r->connection->log, 0,
                      "delaying request by %M ms, by ratewell zone \"%V\"",
                      delay, &ctx->name);
        ngx_http_ratewell_set_status(r, req, NGX_HTTP_RATEWELL_DELAYED);

        /* As limit_req: wait on a write timer, noticing meanwhile a client that closes. */
        if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        r->read_event_handler = ngx_http_test_reading;
        r->write_event_handler = ngx_http_ratewell_delay;

        r->connection->write->delayed = 1;
        ngx_add_timer(r->connection->write, delay);

        return NGX_AGAIN;
    }

    ctx = asked[verdict->rejected_by < n ? verdict->rejected_by : 0];

    seconds = 0;
    if (verdict->retry_after_ns != RATEWELL_NO_RETRY) {
        seconds = verdict->retry_after_ns / 1000000000
                  + (verdict->retry_after_ns % 1000000000 != 0);
        req->retry_after = (int64_t) seconds;
    }

    if (lcf->dry_run) {
        (void) ngx_atomic_fetch_add(&ctx->sh->dry_run_rejected, 1);
        ngx_log_error(lcf->log_level, r->connection->log, 0,
                      "limiting requests, dry run, by ratewell zone \"%V\"",
                      &ctx->name);
        ngx_http_ratewell_set_status(r, req, NGX_HTTP_RATEWELL_REJECTED_DRY_RUN);
        return NGX_DECLINED;
    }

    (void) ngx_atomic_fetch_add(&ctx->sh->rejected, 1);
    ngx_http_ratewell_set_status(r, req, NGX_HTTP_RATEWELL_REJECTED);

    if (verdict->retry_after_ns == RATEWELL_NO_RETRY) {
        ngx_log_error(lcf->log_level, r->connection->log, 0,
                      "limiting requests by ratewell zone \"%V\": "
                      "more than its capacity", &ctx->name);
        return lcf->status;
    }

    if (verdict->table_full) {
        ngx_log_error(lcf->log_level, r->connection->log, 0,
                      "ratewell zone \"%V\" is full: a new key is refused, "
                      "retry after %uL s", &ctx->name, seconds);

    } else {
        ngx_log_error(lcf->log_level, r->connection->log, 0,
                      "limiting requests by ratewell zone \"%V\", "
                      "retry after %uL s", &ctx->name, seconds);
    }

    if (lcf->headers) {
        p = ngx_pnalloc(r->pool, NGX_INT64_LEN);
        if (p == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ngx_http_ratewell_add_header(r, &ngx_http_ratewell_retry_after,
                                         p, ngx_sprintf(p, "%uL", seconds) - p)
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    return lcf->status;
}


/* The write timer of a delayed request fired (or the connection became writable first). */
static void
ngx_http_ratewell_delay(ngx_http_request_t *r)
{
    ngx_event_t  *wev;

    wev = r->connection->write;

    /* nginx clears `delayed` when the timer fires; until then, only keep waiting. */
    if (wev->delayed) {

        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        }

        return;
    }

    if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;

    /* The handler finds the request decided and declines: the phases go on. */
    ngx_http_core_run_phases(r);
}


/* $ratewell_status, $ratewell_remaining, $ratewell_retry_after of the main request; not found
 * where no zone decided it (and, for the retry time, where it was not rejected or no wait lets
 * it through). */
static ngx_int_t
ngx_http_ratewell_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                   *p;
    ngx_http_ratewell_req_t  *req;

    req = ngx_http_ratewell_decided(r->main);

    if (req == NULL || req->status == 0
        || (data == 2 && req->retry_after < 0))
    {
        v->not_found = 1;
        return NGX_OK;
    }

    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    if (data == 0) {
        v->len = ngx_http_ratewell_statuses[req->status - 1].len;
        v->data = ngx_http_ratewell_statuses[req->status - 1].data;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_INT64_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->data = p;
    v->len = (data == 1 ? ngx_sprintf(p, "%uL", req->remaining)
                        : ngx_sprintf(p, "%L", req->retry_after)) - p;

    return NGX_OK;
}


static ngx_int_t
ngx_http_ratewell_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_ratewell_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


/* A label value of Prometheus's text format: `\`, `"` and newlines escaped. */
static u_char *
ngx_http_ratewell_label(u_char *p, ngx_str_t *value)
{
    ngx_uint_t  i;

    for (i = 0; i < value->len; i++) {
        switch (value->data[i]) {
        case '\\': *p++ = '\\'; *p++ = '\\'; break;
        case '"':  *p++ = '\\'; *p++ = '"'; break;
        case '\n': *p++ = '\\'; *p++ = 'n'; break;
        default:   *p++ = value->data[i];
        }
    }

    return p;
}


/* ratewell_metrics: every zone's counters and occupancy, in Prometheus's text format. */
static ngx_int_t
ngx_http_ratewell_metrics_handler(ngx_http_request_t *r)
{
    static const char *outcomes[] = {
        "admitted", "rejected", "delayed", "dry_run_rejected", "dry_run_delayed"
    };

    u_char                         *p, *start;
    size_t                          size;
    uint64_t                        counts[5], gauges[5];
    ngx_int_t                       rc;
    ngx_buf_t                      *b;
    ngx_uint_t                      i, j, k;
    ngx_chain_t                     out;
    ratewell_stats                  stats;
    ngx_http_ratewell_ctx_t       **zones, *ctx;
    ngx_http_ratewell_main_conf_t  *mcf;

    static const char *gauge_names[] = {
        "ratewell_zone_keys", "ratewell_zone_capacity",
        "ratewell_zone_reclaims_total", "ratewell_zone_evictions_total",
        "ratewell_zone_refused_total"
    };
    static const char *gauge_help[] = {
        "# HELP ratewell_zone_keys Keys holding state in a ratewell zone.\n"
        "# TYPE ratewell_zone_keys gauge\n",
        "# HELP ratewell_zone_capacity Keys a ratewell zone holds.\n"
        "# TYPE ratewell_zone_capacity gauge\n",
        "# HELP ratewell_zone_reclaims_total Keys dropped from a ratewell zone "
        "because their state was a new key's (nothing lost).\n"
        "# TYPE ratewell_zone_reclaims_total counter\n",
        "# HELP ratewell_zone_evictions_total Limited keys a full ratewell zone "
        "evicted for a new one (on_full=evict).\n"
        "# TYPE ratewell_zone_evictions_total counter\n",
        "# HELP ratewell_zone_refused_total New keys a full ratewell zone "
        "refused (on_full=refuse).\n"
        "# TYPE ratewell_zone_refused_total counter\n"
    };

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    mcf = ngx_http_get_module_main_conf(r, ngx_http_ratewell_module);
    zones = mcf->zones.elts;

    size = 1024;
    for (k = 0; k < 5; k++) {
        size += ngx_strlen(gauge_help[k]);
    }
    for (i = 0; i < mcf->zones.nelts; i++) {
        size += 10 * (2 * zones[i]->name.len + 96);
    }

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    start = b->last;
    p = ngx_cpymem(b->last,
                   "# HELP ratewell_requests_total Requests a ratewell zone "
                   "decided, by outcome (a delayed request is admitted too; "
                   "dry-run outcomes are not enforced).\n"
                   "# TYPE ratewell_requests_total counter\n",
                   sizeof("# HELP ratewell_requests_total Requests a ratewell zone "
                          "decided, by outcome (a delayed request is admitted too; "
                          "dry-run outcomes are not enforced).\n"
                          "# TYPE ratewell_requests_total counter\n") - 1);

    for (i = 0; i < mcf->zones.nelts; i++) {
        ctx = zones[i];
        if (ctx->sh == NULL) {
            continue;
        }

        counts[0] = ctx->sh->admitted;
        counts[1] = ctx->sh->rejected;
        counts[2] = ctx->sh->delayed;
        counts[3] = ctx->sh->dry_run_rejected;
        counts[4] = ctx->sh->dry_run_delayed;

        for (j = 0; j < 5; j++) {
            p = ngx_sprintf(p, "ratewell_requests_total{zone=\"");
            p = ngx_http_ratewell_label(p, &ctx->name);
            p = ngx_sprintf(p, "\",outcome=\"%s\"} %uL\n", outcomes[j],
                            counts[j]);
        }
    }

    for (k = 0; k < 5; k++) {
        p = ngx_cpymem(p, gauge_help[k], ngx_strlen(gauge_help[k]));

        for (i = 0; i < mcf->zones.nelts; i++) {
            ctx = zones[i];
            if (ctx->zone == NULL
                || ratewell_zone_stats(ctx->zone, &stats) != 0)
            {
                continue;
            }

            gauges[0] = stats.keys;
            gauges[1] = stats.capacity;
            gauges[2] = stats.reclaims;
            gauges[3] = stats.evictions;
            gauges[4] = stats.refused;

            p = ngx_sprintf(p, "%s{zone=\"", gauge_names[k]);
            p = ngx_http_ratewell_label(p, &ctx->name);
            p = ngx_sprintf(p, "\"} %uL\n", gauges[k]);
        }
    }

    b->last = p;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - start;
    ngx_str_set(&r->headers_out.content_type, "text/plain; version=0.0.4");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);
    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


static ngx_int_t
ngx_http_ratewell_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_ratewell_ctx_t  *octx = data;

    u_char                    err[NGX_HTTP_RATEWELL_ERR_LEN];
    size_t                    capacity, len;
    int64_t                   restored;
    ngx_int_t                 placed;
    ngx_uint_t                fresh;
    ratewell_zone            *zone;
    ngx_slab_pool_t          *shpool;
    ngx_http_ratewell_ctx_t  *ctx;

    ctx = shm_zone->data;
    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;
    fresh = 0;
    placed = NGX_OK;

    if (octx) {
        /* A reload that keeps the zone (same name and size): the table is where it was. */
        if (ctx->key.value.len != octx->key.value.len
            || ngx_strncmp(ctx->key.value.data, octx->key.value.data,
                           ctx->key.value.len)
               != 0)
        {
            ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                          "ratewell_zone \"%V\" uses the \"%V\" key "
                          "while previously it used the \"%V\" key",
                          &shm_zone->shm.name, &ctx->key.value,
                          &octx->key.value);
            return NGX_ERROR;
        }

        ctx->sh = octx->sh;

        if (octx->table
            && ngx_http_ratewell_table_keep(ctx, octx->table) != NGX_OK)
        {
            return NGX_ERROR;
        }

    } else if (shm_zone->shm.exists) {
        ctx->sh = shpool->data;

    } else {
        ctx->sh = ngx_slab_calloc(shpool, sizeof(ngx_http_ratewell_shctx_t));
        if (ctx->sh == NULL) {
            return NGX_ERROR;
        }

        /* The rest of the zone's pages, in one run (a new pool's free pages are contiguous):
         * the largest table that fits. */
        len = 0;
        capacity = ratewell_capacity(ctx->policy.data, ctx->policy.len,
                                     shpool->pfree << ngx_pagesize_shift, &len);
        if (capacity == 0) {
            ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                          "ratewell_zone \"%V\" is too small for its policy "
                          "\"%V\": not one key fits in %uz bytes",
                          &shm_zone->shm.name, &ctx->policy,
                          (size_t) (shpool->pfree << ngx_pagesize_shift));
            return NGX_ERROR;
        }

        ctx->sh->len = len;
        ctx->sh->capacity = capacity;
        shpool->data = ctx->sh;

        /* At a binary upgrade's start, the table the running nginx decides on, if it is this
         * zone's; else a new one. */
        placed = ngx_http_ratewell_table_place(ctx, shpool, 1, shm_zone->shm.log);
        if (placed == NGX_ERROR) {
            return NGX_ERROR;
        }

        fresh = (placed != NGX_DONE);
    }

    /* The first opening initialises the table; a later one (a reload, a binary upgrade's
     * takeover) checks that the table was made with this policy. The workers open it again
     * after they fork. */
    zone = ngx_http_ratewell_open(ctx, err);

    if (zone == NULL && placed == NGX_DONE) {
        /* The old binary's table, which this build cannot decide on (another layout, clock or
         * hash): a new table, as at a start. */
        ngx_log_error(NGX_LOG_NOTICE, shm_zone->shm.log, 0,
                      "ratewell_zone \"%V\": the running nginx's table is not taken "
                      "over: %s", &shm_zone->shm.name, err);
        ngx_http_ratewell_table_release(ctx);

        if (ngx_http_ratewell_table_place(ctx, shpool, 0, shm_zone->shm.log)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        fresh = 1;
        zone = ngx_http_ratewell_open(ctx, err);
    }

    if (zone == NULL) {
        ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                      "ratewell_zone \"%V\": %s", &shm_zone->shm.name, err);
        return NGX_ERROR;
    }

    if (placed == NGX_DONE && fresh == 0) {
        ngx_log_error(NGX_LOG_NOTICE, shm_zone->shm.log, 0,
                      "ratewell_zone \"%V\": the running nginx's table is taken over: "
                      "both binaries decide on it", &shm_zone->shm.name);
    }

    /* A new zone at nginx's start (not at a reload, whose zones the old workers hold the
     * state of, nor at a binary upgrade that took the running table over): the state the last
     * stop saved, if any. Before any worker runs, so the master is alone on the zone. */
    if (fresh && ctx->state.len && ngx_is_init_cycle(ctx->cycle->old_cycle)) {
        restored = ratewell_zone_restore(zone, ctx->state.data, ctx->state.len,
                                         err, sizeof(err));
        if (restored >= 0) {
            ngx_log_error(NGX_LOG_NOTICE, shm_zone->shm.log, 0,
                          "ratewell_zone \"%V\": %L keys restored from \"%V\"",
                          &shm_zone->shm.name, restored, &ctx->state);

        } else if (restored == -1) {
            /* A state that cannot be read starts the zone empty: limits reset, nginx runs. */
            ngx_log_error(NGX_LOG_ALERT, shm_zone->shm.log, 0,
                          "ratewell_zone \"%V\": not restored, it starts empty: %s",
                          &shm_zone->shm.name, err);
        }
    }

    ratewell_zone_close(zone);

    return NGX_OK;
}


static void *
ngx_http_ratewell_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_ratewell_main_conf_t  *mcf;

    mcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_ratewell_main_conf_t));
    if (mcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&mcf->zones, cf->pool, 4,
                       sizeof(ngx_http_ratewell_ctx_t *))
        != NGX_OK
        || ngx_array_init(&mcf->limits, cf->pool, 4,
                          sizeof(ngx_http_ratewell_limit_t *))
           != NGX_OK)
    {
        return NULL;
    }

    return mcf;
}


static void *
ngx_http_ratewell_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_ratewell_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_ratewell_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->limits = NULL;
     */

    conf->status = NGX_CONF_UNSET_UINT;
    conf->log_level = NGX_CONF_UNSET_UINT;
    conf->dry_run = NGX_CONF_UNSET;
    conf->headers = NGX_CONF_UNSET;

    return conf;
}


static char *
ngx_http_ratewell_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_ratewell_loc_conf_t *prev = parent;
    ngx_http_ratewell_loc_conf_t *conf = child;

    if (conf->limits == NULL) {
        conf->limits = prev->limits;
    }

    /* The drop-in answers as the limit_req it replaces: 503 and no fields, unless told. */
    ngx_conf_merge_uint_value(conf->status, prev->status,
                              NGX_HTTP_RATEWELL_DROP_IN ? NGX_HTTP_SERVICE_UNAVAILABLE
                                                        : NGX_HTTP_TOO_MANY_REQUESTS);
    ngx_conf_merge_uint_value(conf->log_level, prev->log_level, NGX_LOG_ERR);
    ngx_conf_merge_value(conf->dry_run, prev->dry_run, 0);
    ngx_conf_merge_value(conf->headers, prev->headers, !NGX_HTTP_RATEWELL_DROP_IN);

    /* As limit_req: delays are logged one level below rejections. */
    conf->delay_log_level = (conf->log_level == NGX_LOG_INFO) ?
                                NGX_LOG_INFO : conf->log_level + 1;

    return NGX_CONF_OK;
}


/*
 * ratewell_zone KEY zone=NAME:SIZE policy="SPEC" | rate=Nr/s [on_full=refuse|evict]
 *     [state=PATH]
 *
 * A full zone reclaims the keys whose state is a fresh key's first (nothing is lost); then,
 * by default (on_full=refuse), it refuses a new key rather than forget a limited one;
 * on_full=evict forgets the key whose loss grants least.
 *
 * nginx splits a quoted value inside a word at its spaces (policy="a b" is two words), so the
 * words from one that begins policy=" to the one that ends with a quote are one policy.
 */
static char *
ngx_http_ratewell_zone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_ratewell_main_conf_t  *mcf = conf;

    u_char                            *p, err[NGX_HTTP_RATEWELL_ERR_LEN];
    size_t                             len;
    ssize_t                            size, written;
    ngx_str_t                         *value, name, s, policy, rate, state;
    ngx_uint_t                         i, j, refuse;
    ngx_shm_zone_t                    *shm_zone;
    ngx_http_ratewell_ctx_t           *ctx, **slot;
    ngx_http_compile_complex_value_t   ccv;

    value = cf->args->elts;

    ctx = ngx_pcalloc(cf->pool, sizeof(ngx_http_ratewell_ctx_t));
    if (ctx == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

    ccv.cf = cf;
    ccv.value = &value[1];
    ccv.complex_value = &ctx->key;

    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    ctx->key_index = NGX_ERROR;

    if (value[1].len > 1 && value[1].data[0] == '$') {
        s.data = value[1].data + 1;
        s.len = value[1].len - 1;

        for (j = 0; j < s.len; j++) {
            if (!(s.data[j] == '_' || (s.data[j] >= '0' && s.data[j] <= '9')
                  || ((s.data[j] | 0x20) >= 'a' && (s.data[j] | 0x20) <= 'z')))
            {
                break;
            }
        }

        if (j == s.len) {
            ctx->key_index = ngx_http_get_variable_index(cf, &s);
            if (ctx->key_index == NGX_ERROR) {
                return NGX_CONF_ERROR;
            }
        }
    }

    size = 0;
    refuse = 1;
    ngx_str_null(&name);
    ngx_str_null(&policy);
    ngx_str_null(&rate);
    ngx_str_null(&state);

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {

            name.data = value[i].data + 5;

            p = (u_char *) ngx_strchr(name.data, ':');

            if (p == NULL) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            name.len = p - name.data;

            s.data = p + 1;
            s.len = value[i].data + value[i].len - s.data;

            size = ngx_parse_size(&s);

            if (size == NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            if (size < (ssize_t) (8 * ngx_pagesize)) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "zone \"%V\" is too small", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "policy=", 7) == 0) {

            s.data = value[i].data + 7;
            s.len = value[i].len - 7;

            if (s.len > 0 && s.data[0] == '"') {
                /* The words up to the one that ends the quote, joined by spaces. */
                len = 0;
                for (j = i; j < cf->args->nelts; j++) {
                    len += value[j].len + 1;
                    if (value[j].len > (j == i ? 8 : 0)
                        && value[j].data[value[j].len - 1] == '"')
                    {
                        break;
                    }
                }

                if (j == cf->args->nelts) {
                    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                       "unterminated quote in \"%V\"",
                                       &value[i]);
                    return NGX_CONF_ERROR;
                }

                policy.data = ngx_pnalloc(cf->pool, len);
                if (policy.data == NULL) {
                    return NGX_CONF_ERROR;
                }

                p = ngx_cpymem(policy.data, s.data + 1, s.len - 1);
                for (i++; i <= j; i++) {
                    *p++ = ' ';
                    p = ngx_cpymem(p, value[i].data, value[i].len);
                }
                i--;

                /* Without the closing quote. */
                policy.len = p - policy.data - 1;

            } else {
                policy = s;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "rate=", 5) == 0) {
            rate.data = value[i].data + 5;
            rate.len = value[i].len - 5;
            continue;
        }

        if (ngx_strncmp(value[i].data, "state=", 6) == 0) {
            state.data = value[i].data + 6;
            state.len = value[i].len - 6;

            if (state.len == 0) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "\"%V\" names no file", &value[i]);
                return NGX_CONF_ERROR;
            }

            /* Relative to nginx's prefix, as nginx's own paths are. */
            if (ngx_conf_full_name(cf->cycle, &state, 0) != NGX_OK) {
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strcmp(value[i].data, "on_full=evict") == 0) {
            refuse = 0;
            continue;
        }

        if (ngx_strcmp(value[i].data, "on_full=refuse") == 0) {
            refuse = 1;
            continue;
        }

        if (ngx_strcmp(value[i].data, "sync") == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"sync\" is NGINX Plus's zone synchronisation "
                               "between machines; a ratewell zone is exact "
                               "across the workers of one nginx");
            return NGX_CONF_ERROR;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    if (name.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"zone\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (policy.len && rate.len) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" takes either \"policy\" or \"rate\", "
                           "not both", &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (rate.len) {
        /* limit_req's grammar: nginx's leaky bucket, as compat=nginx decides it. */
        written = ratewell_rate_policy(rate.data, rate.len, NULL, 0,
                                       err, sizeof(err));
        if (written < 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "zone \"%V\": %s", &name, err);
            return NGX_CONF_ERROR;
        }

        policy.data = ngx_pnalloc(cf->pool, written);
        if (policy.data == NULL) {
            return NGX_CONF_ERROR;
        }

        policy.len = ratewell_rate_policy(rate.data, rate.len, policy.data,
                                          written, err, sizeof(err));
        ctx->rate = 1;
    }

    if (policy.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"policy\" or \"rate\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (ratewell_policy_check(policy.data, policy.len, err, sizeof(err)) != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid policy \"%V\" of zone \"%V\": %s",
                           &policy, &name, err);
        return NGX_CONF_ERROR;
    }

    shm_zone = ngx_shared_memory_add(cf, &name, size,
                                     &ngx_http_ratewell_module);
    if (shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    if (shm_zone->data) {
        ctx = shm_zone->data;

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V \"%V\" is already bound to key \"%V\"",
                           &cmd->name, &name, &ctx->key.value);
        return NGX_CONF_ERROR;
    }

    ctx->name = name;
    ctx->policy = policy;
    ctx->burst = ratewell_policy_burst(policy.data, policy.len);
    ctx->refuse = refuse;
    ctx->state = state;
    ctx->cycle = cf->cycle;
    ctx->shm_zone = shm_zone;

    shm_zone->init = ngx_http_ratewell_init_zone;
    shm_zone->data = ctx;

    slot = ngx_array_push(&mcf->zones);
    if (slot == NULL) {
        return NGX_CONF_ERROR;
    }

    *slot = ctx;

    return NGX_CONF_OK;
}


/* ratewell zone=NAME [burst=N] [nodelay | delay=N]: every zone named in a location decides its
 * requests, all or nothing; burst and delay are limit_req's, on a leaky-bucket zone. */
static char *
ngx_http_ratewell(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_ratewell_loc_conf_t  *lcf = conf;

    ngx_int_t                       burst, delay;
    ngx_str_t                      *value, s;
    ngx_uint_t                      i, nodelay;
    ngx_shm_zone_t                 *shm_zone;
    ngx_http_ratewell_limit_t      *limit, **limits, **slot;
    ngx_http_ratewell_main_conf_t  *mcf;

    value = cf->args->elts;

    shm_zone = NULL;
    burst = -1;
    delay = -1;
    nodelay = 0;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {

            s.len = value[i].len - 5;
            s.data = value[i].data + 5;

            shm_zone = ngx_shared_memory_add(cf, &s, 0,
                                             &ngx_http_ratewell_module);
            if (shm_zone == NULL) {
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "burst=", 6) == 0) {

            burst = ngx_atoi(value[i].data + 6, value[i].len - 6);
            if (burst == NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid burst value \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "delay=", 6) == 0) {

            delay = ngx_atoi(value[i].data + 6, value[i].len - 6);
            if (delay == NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid delay value \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strcmp(value[i].data, "nodelay") == 0) {
            nodelay = 1;
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    if (shm_zone == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"zone\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (nodelay && delay != -1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"nodelay\" and \"delay=\" exclude each other");
        return NGX_CONF_ERROR;
    }

    if (lcf->limits == NULL) {
        lcf->limits = ngx_array_create(cf->pool, 1,
                                       sizeof(ngx_http_ratewell_limit_t *));
        if (lcf->limits == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    limits = lcf->limits->elts;

    for (i = 0; i < lcf->limits->nelts; i++) {
        if (shm_zone == limits[i]->shm_zone) {
            return "is duplicate";
        }
    }

    limit = ngx_pcalloc(cf->pool, sizeof(ngx_http_ratewell_limit_t));
    slot = ngx_array_push(lcf->limits);
    if (limit == NULL || slot == NULL) {
        return NGX_CONF_ERROR;
    }

    *slot = limit;

    limit->shm_zone = shm_zone;

    if (burst == -1 && delay == -1 && !nodelay) {
        /* Neither burst nor delay: the zone's own (resolved once every zone is known). */
        limit->burst = -1;
        limit->delay = NGX_HTTP_RATEWELL_ZONES_OWN;

    } else {
        /* As limit_req: burst 0 unless given; with neither nodelay nor delay=, every excess
         * request is delayed (delay 0). */
        limit->burst = (burst == -1) ? 0 : burst;
        limit->delay = nodelay ? -1 : (delay == -1 ? 0 : delay);
    }

    limit->file = cf->conf_file->file.name;
    limit->line = cf->conf_file->line;

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_ratewell_module);
    slot = ngx_array_push(&mcf->limits);
    if (slot == NULL) {
        return NGX_CONF_ERROR;
    }

    *slot = limit;

    return NGX_CONF_OK;
}


static char *
ngx_http_ratewell_metrics(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_ratewell_metrics_handler;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_ratewell_init(ngx_conf_t *cf)
{
    ngx_uint_t                      i;
    ngx_http_handler_pt            *h;
    ngx_http_ratewell_ctx_t        *ctx;
    ngx_http_ratewell_limit_t     **limits, *limit;
    ngx_http_core_main_conf_t      *cmcf;
    ngx_http_ratewell_main_conf_t  *mcf;

    /* Every zone is known now: check each location's burst against its zone. */
    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_ratewell_module);
    limits = mcf->limits.elts;

    for (i = 0; i < mcf->limits.nelts; i++) {
        limit = limits[i];
        ctx = limit->shm_zone->data;

        if (ctx == NULL) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "unknown ratewell zone \"%V\" in %V:%ui",
                          &limit->shm_zone->shm.name, &limit->file,
                          limit->line);
            return NGX_ERROR;
        }

        if (limit->delay == NGX_HTTP_RATEWELL_ZONES_OWN) {
            /* No burst, no delay: the zone's own policy; a rate= zone's is burst 0. */
            limit->burst = ctx->rate ? 0 : -1;
            limit->delay = ctx->rate ? 0 : -1;
        }

        if (limit->burst < 0) {
            continue;
        }

        if (ctx->burst < 0) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "burst, delay and nodelay apply to a leaky-bucket "
                          "zone; ratewell zone \"%V\" decides by \"%V\" "
                          "in %V:%ui", &ctx->name, &ctx->policy,
                          &limit->file, limit->line);
            return NGX_ERROR;
        }

        if (limit->burst > ctx->burst) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "burst=%L is above the %L of ratewell zone \"%V\" "
                          "(a location narrows its zone's burst, and cannot "
                          "widen it) in %V:%ui", limit->burst, ctx->burst,
                          &ctx->name, &limit->file, limit->line);
            return NGX_ERROR;
        }
    }

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_ratewell_handler;

    return NGX_OK;
}


/* A handle of this process's on the zone's table (NULL, the reason in `err`). */
static ratewell_zone *
ngx_http_ratewell_open(ngx_http_ratewell_ctx_t *ctx,
    u_char err[NGX_HTTP_RATEWELL_ERR_LEN])
{
    return ratewell_zone_open(ctx->sh->region, ctx->sh->len,
                              ctx->policy.data, ctx->policy.len,
                              ctx->sh->capacity, (int32_t) ctx->refuse,
                              ctx->name.data, ctx->name.len,
                              err, NGX_HTTP_RATEWELL_ERR_LEN);
}


/* Place a new zone's table (ctx->sh->len bytes) and set ctx->sh->region: with `adopt`, at a
 * binary upgrade's start, the running nginx's table of this zone if it left one (NGX_DONE);
 * else a new table in a memory file of its own, or in the zone where there is none (NGX_OK). */
static ngx_int_t
ngx_http_ratewell_table_place(ngx_http_ratewell_ctx_t *ctx, ngx_slab_pool_t *shpool,
    ngx_uint_t adopt, ngx_log_t *log)
{
#if (NGX_LINUX)
    ngx_int_t                   rc;
    ngx_http_ratewell_table_t  *t;

    t = NULL;
    rc = NGX_OK;

    if (adopt && ngx_inherited && ngx_is_init_cycle(ctx->cycle->old_cycle)) {
        t = ngx_http_ratewell_table_inherited(ctx, log);
        rc = NGX_DONE;
    }

    if (t == NULL) {
        t = ngx_http_ratewell_table_create(ctx, log);
        rc = NGX_OK;
    }

    if (t) {
        if (ngx_http_ratewell_table_keep(ctx, t) != NGX_OK) {
            ngx_http_ratewell_table_free(t);
            return NGX_ERROR;
        }

        ctx->sh->region = t->addr + t->offset;
        return rc;
    }
#endif

    ctx->sh->region = ngx_slab_calloc(shpool, ctx->sh->len);

    return ctx->sh->region ? NGX_OK : NGX_ERROR;
}


/* ctx's zone uses the table t, until ctx's cycle goes. */
static ngx_int_t
ngx_http_ratewell_table_keep(ngx_http_ratewell_ctx_t *ctx, ngx_http_ratewell_table_t *t)
{
    ngx_pool_cleanup_t  *cln;

    cln = ngx_pool_cleanup_add(ctx->cycle->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    t->refs++;
    ctx->table = t;
    cln->handler = ngx_http_ratewell_table_release;
    cln->data = ctx;

    return NGX_OK;
}


/* ctx's cycle goes (a reload replaced it, a failed one is dropped, the process exits): the
 * table is unmapped and its file closed when no other cycle of the process uses it. */
static void
ngx_http_ratewell_table_release(void *data)
{
    ngx_http_ratewell_ctx_t  *ctx = data;

    ngx_http_ratewell_table_t  *t;

    t = ctx->table;
    if (t == NULL) {
        return;
    }

    ctx->table = NULL;

    if (--t->refs == 0) {
        ngx_http_ratewell_table_free(t);
    }
}


#if (NGX_LINUX)

/* The bytes of a table file's identity: the header, the zone's name, key and policy, to a page
 * boundary (where the table starts). */
static size_t
ngx_http_ratewell_identity_size(ngx_http_ratewell_ctx_t *ctx)
{
    return ngx_align(sizeof(ngx_http_ratewell_identity_t) + ctx->name.len
                     + ctx->key.value.len + ctx->policy.len, ngx_pagesize);
}


static void
ngx_http_ratewell_identity(ngx_http_ratewell_ctx_t *ctx, u_char *buf)
{
    u_char                        *p;
    ngx_http_ratewell_identity_t  *id;

    id = (ngx_http_ratewell_identity_t *) buf;
    id->magic = NGX_HTTP_RATEWELL_TABLE_MAGIC;
    id->len = ctx->sh->len;
    id->capacity = ctx->sh->capacity;
    id->refuse = ctx->refuse;
    id->name_len = ctx->name.len;
    id->key_len = ctx->key.value.len;
    id->policy_len = ctx->policy.len;

    p = buf + sizeof(ngx_http_ratewell_identity_t);
    p = ngx_cpymem(p, ctx->name.data, ctx->name.len);
    p = ngx_cpymem(p, ctx->key.value.data, ctx->key.value.len);
    ngx_memcpy(p, ctx->policy.data, ctx->policy.len);
}


/* The descriptors of the tables a binary upgrade's new master inherited, -1 once taken over
 * or closed. */
static int         ngx_http_ratewell_inherited[NGX_HTTP_RATEWELL_MAX_INHERITED];
static ngx_uint_t  ngx_http_ratewell_ninherited;


/* The descriptors the old master named (its NGX_HTTP_RATEWELL_TABLES_VAR) that hold a table
 * file, once. */
static void
ngx_http_ratewell_import(ngx_log_t *log)
{
    int          fd;
    u_char      *v, *p;
    uint64_t     magic;
    static int   imported;

    if (imported) {
        return;
    }

    imported = 1;

    v = (u_char *) getenv(NGX_HTTP_RATEWELL_TABLES_VAR);
    if (v == NULL) {
        return;
    }

    for (p = v; *p; v = ++p) {
        while (*p >= '0' && *p <= '9') {
            p++;
        }

        fd = (p > v) ? (int) ngx_atoi(v, p - v) : NGX_ERROR;

        if (fd < 0 || (*p != ';' && *p != '\0')
            || ngx_http_ratewell_ninherited == NGX_HTTP_RATEWELL_MAX_INHERITED)
        {
            ngx_log_error(NGX_LOG_ALERT, log, 0,
                          "invalid " NGX_HTTP_RATEWELL_TABLES_VAR " environment "
                          "variable \"%s\": no table taken over from here",
                          getenv(NGX_HTTP_RATEWELL_TABLES_VAR));
            return;
        }

        /* A table file's (its identity's magic number), or not one to touch. */
        if (pread(fd, &magic, sizeof(magic), 0) == (ssize_t) sizeof(magic)
            && magic == NGX_HTTP_RATEWELL_TABLE_MAGIC)
        {
            ngx_http_ratewell_inherited[ngx_http_ratewell_ninherited++] = fd;
        }

        if (*p == '\0') {
            break;
        }
    }
}


/* The inherited table of ctx's zone, mapped, if the old master left one made for the same
 * zone: the same name, key, policy, size and on_full (a table of the zone's name made for
 * another is closed, and the zone starts as at a start). */
static ngx_http_ratewell_table_t *
ngx_http_ratewell_table_inherited(ngx_http_ratewell_ctx_t *ctx, ngx_log_t *log)
{
    int                            fd;
    u_char                        *ours, *theirs, *addr, *p;
    size_t                         size, isize;
    ngx_uint_t                     i;
    const char                    *differs;
    struct stat                    st;
    ngx_http_ratewell_table_t     *t;
    ngx_http_ratewell_identity_t   head, *want;

    ngx_http_ratewell_import(log);

    isize = ngx_http_ratewell_identity_size(ctx);
    size = isize + ctx->sh->len;

    for (i = 0; i < ngx_http_ratewell_ninherited; i++) {
        fd = ngx_http_ratewell_inherited[i];

        if (fd == -1) {
            continue;
        }

        if (pread(fd, &head, sizeof(head), 0) != (ssize_t) sizeof(head)
            || head.magic != NGX_HTTP_RATEWELL_TABLE_MAGIC
            || head.name_len > 4096)
        {
            continue;
        }

        /* Whose: the zone's name, right after the header. */
        ours = ngx_alloc(2 * isize, log);
        if (ours == NULL) {
            return NULL;
        }

        theirs = ours + isize;
        ngx_memzero(ours, 2 * isize);
        ngx_http_ratewell_identity(ctx, ours);
        want = (ngx_http_ratewell_identity_t *) ours;

        if (head.name_len != ctx->name.len
            || pread(fd, theirs, isize, 0) <= (ssize_t) sizeof(head)
            || ngx_memcmp(theirs + sizeof(head), ctx->name.data, ctx->name.len)
               != 0)
        {
            ngx_free(ours);
            continue;
        }

        /* This zone's: the rest must match, or the zone starts anew. */
        p = theirs + sizeof(head) + ctx->name.len;

        if (head.key_len != want->key_len
            || ngx_memcmp(p, ctx->key.value.data, ctx->key.value.len) != 0)
        {
            differs = "key";

        } else if (head.policy_len != want->policy_len
                   || ngx_memcmp(p + ctx->key.value.len, ctx->policy.data,
                                 ctx->policy.len)
                      != 0)
        {
            differs = "policy";

        } else if (head.len != want->len || head.capacity != want->capacity
                   || fstat(fd, &st) == -1 || (size_t) st.st_size != size)
        {
            differs = "size";

        } else if (head.refuse != want->refuse) {
            differs = "on_full";

        } else {
            differs = NULL;
        }

        ngx_free(ours);
        ngx_http_ratewell_inherited[i] = -1;

        if (differs) {
            ngx_log_error(NGX_LOG_NOTICE, log, 0,
                          "ratewell_zone \"%V\": the running nginx's table is not taken "
                          "over: its %s differs", &ctx->name, differs);
            close(fd);
            return NULL;
        }

        addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (addr == MAP_FAILED) {
            ngx_log_error(NGX_LOG_ALERT, log, ngx_errno,
                          "ratewell_zone \"%V\": mmap() of the running nginx's table "
                          "failed", &ctx->name);
            close(fd);
            return NULL;
        }

        t = ngx_alloc(sizeof(ngx_http_ratewell_table_t), log);
        if (t == NULL) {
            munmap(addr, size);
            close(fd);
            return NULL;
        }

        t->fd = fd;
        t->addr = addr;
        t->size = size;
        t->offset = isize;
        t->refs = 0;

        return t;
    }

    return NULL;
}


/* A new, zeroed table in a memory file of its own, its identity written; NULL (logged) where
 * the system makes none: the table then stays in the zone, and a binary upgrade starts it
 * anew. */
static ngx_http_ratewell_table_t *
ngx_http_ratewell_table_create(ngx_http_ratewell_ctx_t *ctx, ngx_log_t *log)
{
    int                         fd;
    char                        name[240];
    u_char                     *addr;
    size_t                      size, isize;
    ngx_http_ratewell_table_t  *t;

    isize = ngx_http_ratewell_identity_size(ctx);
    size = isize + ctx->sh->len;

    *ngx_snprintf((u_char *) name, sizeof(name) - 1, "ratewell_zone:%V", &ctx->name) = '\0';

    /* Not closed on exec: a new binary inherits it. */
    fd = memfd_create(name, 0);
    if (fd == -1) {
        ngx_log_error(NGX_LOG_WARN, log, ngx_errno,
                      "ratewell_zone \"%V\": memfd_create() failed: the table is kept "
                      "in the zone, and a binary upgrade starts it empty", &ctx->name);
        return NULL;
    }

    if (ftruncate(fd, size) == -1) {
        ngx_log_error(NGX_LOG_WARN, log, ngx_errno,
                      "ratewell_zone \"%V\": ftruncate() of its memory file failed: the "
                      "table is kept in the zone, and a binary upgrade starts it empty",
                      &ctx->name);
        close(fd);
        return NULL;
    }

    addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        ngx_log_error(NGX_LOG_WARN, log, ngx_errno,
                      "ratewell_zone \"%V\": mmap() of its memory file failed: the table "
                      "is kept in the zone, and a binary upgrade starts it empty",
                      &ctx->name);
        close(fd);
        return NULL;
    }

    t = ngx_alloc(sizeof(ngx_http_ratewell_table_t), log);
    if (t == NULL) {
        munmap(addr, size);
        close(fd);
        return NULL;
    }

    ngx_http_ratewell_identity(ctx, addr);

    t->fd = fd;
    t->addr = addr;
    t->size = size;
    t->offset = isize;
    t->refs = 0;

    return t;
}

#endif


static void
ngx_http_ratewell_table_free(ngx_http_ratewell_table_t *t)
{
#if (NGX_LINUX)
    munmap(t->addr, t->size);
    close(t->fd);
#endif
    ngx_free(t);
}


/* After every zone is placed: the inherited tables no zone took are closed, and the tables'
 * descriptors are named for a binary upgrade's new master, as nginx names its listening
 * sockets. */
static ngx_int_t
ngx_http_ratewell_init_module(ngx_cycle_t *cycle)
{
#if (NGX_LINUX)
    u_char                         *buf, *p;
    ngx_uint_t                      i, n;
    ngx_str_t                      *var;
    ngx_core_conf_t                *ccf;
    ngx_http_ratewell_ctx_t       **zones;
    ngx_http_ratewell_main_conf_t  *mcf;

    for (i = 0; i < ngx_http_ratewell_ninherited; i++) {
        if (ngx_http_ratewell_inherited[i] != -1) {
            close(ngx_http_ratewell_inherited[i]);
            ngx_http_ratewell_inherited[i] = -1;
        }
    }

    mcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_ratewell_module);
    if (mcf == NULL) {
        return NGX_OK;
    }

    zones = mcf->zones.elts;

    for (n = 0, i = 0; i < mcf->zones.nelts; i++) {
        n += (zones[i]->table != NULL);
    }

    if (n == 0) {
        return NGX_OK;
    }

    buf = ngx_pnalloc(cycle->pool,
                      sizeof(NGX_HTTP_RATEWELL_TABLES_VAR) + n * (NGX_INT_T_LEN + 1) + 1);
    if (buf == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(buf, NGX_HTTP_RATEWELL_TABLES_VAR "=",
                   sizeof(NGX_HTTP_RATEWELL_TABLES_VAR));

    for (i = 0; i < mcf->zones.nelts; i++) {
        if (zones[i]->table) {
            p = ngx_sprintf(p, "%d;", zones[i]->table->fd);
        }
    }

    *p = '\0';

    ccf = (ngx_core_conf_t *) ngx_get_conf(cycle->conf_ctx, ngx_core_module);

    var = ngx_array_push(&ccf->env);
    if (var == NULL) {
        return NGX_ERROR;
    }

    var->data = buf;
    var->len = sizeof(NGX_HTTP_RATEWELL_TABLES_VAR) - 1;
#endif

    return NGX_OK;
}


/* Each worker opens every zone's table for itself (its own counters), after the fork. */
static ngx_int_t
ngx_http_ratewell_init_process(ngx_cycle_t *cycle)
{
    u_char                          err[NGX_HTTP_RATEWELL_ERR_LEN];
    size_t                          len;
    ngx_uint_t                      i;
    ngx_http_ratewell_ctx_t        *ctx, **zones;
    ngx_http_ratewell_limit_t     **limits, *limit;
    ngx_http_ratewell_main_conf_t  *mcf;

    mcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_ratewell_module);
    if (mcf == NULL) {
        return NGX_OK;
    }

    zones = mcf->zones.elts;

    for (i = 0; i < mcf->zones.nelts; i++) {
        ctx = zones[i];

        if (ctx->sh == NULL) {
            continue;
        }

        ctx->zone = ngx_http_ratewell_open(ctx, err);
        if (ctx->zone == NULL) {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                          "ratewell_zone \"%V\": %s", &ctx->name, err);
        }
    }

    /* Each location's RateLimit-Policy item, at its burst. */
    limits = mcf->limits.elts;

    for (i = 0; i < mcf->limits.nelts; i++) {
        limit = limits[i];
        ctx = limit->shm_zone->data;

        if (ctx == NULL || ctx->zone == NULL) {
            continue;
        }

        len = ratewell_zone_policy_field(ctx->zone, limit->burst, limit->delay,
                                         NULL, 0);
        limit->policy_field.data = ngx_pnalloc(cycle->pool, len);
        if (limit->policy_field.data == NULL) {
            return NGX_ERROR;
        }

        limit->policy_field.len =
            ratewell_zone_policy_field(ctx->zone, limit->burst, limit->delay,
                                       limit->policy_field.data, len);
    }

    return NGX_OK;
}


static void
ngx_http_ratewell_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                      i;
    ngx_http_ratewell_ctx_t       **zones;
    ngx_http_ratewell_main_conf_t  *mcf;

    mcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_ratewell_module);
    if (mcf == NULL) {
        return;
    }

    zones = mcf->zones.elts;

    for (i = 0; i < mcf->zones.nelts; i++) {
        ratewell_zone_close(zones[i]->zone);
        zones[i]->zone = NULL;
    }
}


/* nginx stops: the master, its workers gone and its zones still mapped, saves every zone that
 * names a state file. */
static void
ngx_http_ratewell_exit_master(ngx_cycle_t *cycle)
{
    u_char                          err[NGX_HTTP_RATEWELL_ERR_LEN];
    int64_t                         saved;
    ngx_uint_t                      i;
    ratewell_zone                  *zone;
    ngx_http_ratewell_ctx_t        *ctx, **zones;
    ngx_http_ratewell_main_conf_t  *mcf;

    mcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_ratewell_module);
    if (mcf == NULL) {
        return;
    }

    zones = mcf->zones.elts;

    for (i = 0; i < mcf->zones.nelts; i++) {
        ctx = zones[i];

        if (ctx->sh == NULL || ctx->state.len == 0) {
            continue;
        }

        zone = ngx_http_ratewell_open(ctx, err);
        if (zone == NULL) {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                          "ratewell_zone \"%V\" not saved: %s", &ctx->name, err);
            continue;
        }

        saved = ratewell_zone_save(zone, ctx->state.data, ctx->state.len,
                                   err, sizeof(err));
        if (saved < 0) {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                          "ratewell_zone \"%V\" not saved: %s", &ctx->name, err);

        } else {
            ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                          "ratewell_zone \"%V\": %L keys saved to \"%V\"",
                          &ctx->name, saved, &ctx->state);
        }

        ratewell_zone_close(zone);
    }
}
