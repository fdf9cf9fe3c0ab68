//! The admin listener: `/healthz`, `/readyz`, `/leases` (JSON), `/metrics`
//! and `/` (an HTML status page that refreshes itself).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use tokio::net::TcpListener;

use crate::lease::{Coordinator, DefinitionState};
use crate::proxy::hold::Holds;

#[derive(Serialize)]
pub(crate) struct LeasesView {
    pub instance: InstanceView,
    /// Live members as their presence records say (balanced partitions only).
    pub members: Vec<MemberView>,
    pub partitions: Vec<PartitionView>,
    /// The roles of this listing (one page of it when `limit` was given).
    pub roles: Vec<RoleView>,
    /// How many roles the listing holds in all, over every page.
    pub roles_total: usize,
    /// The cursor of the next page (`after=`), while roles remain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Partitions with more roles than this are summarised, not listed, by a
/// `/leases` without parameters (and on the status page).
pub(crate) const LIST_AT_MOST: u32 = 256;

/// Which roles a `/leases` answer lists: `?role=`, `?partition=`,
/// `?held_here=true|false`, `?limit=&after=` (a page, after the role the
/// cursor names), `?full=true` (every role, no summary).
#[derive(Debug, Default, Clone)]
pub(crate) struct Listing {
    role: Option<String>,
    partition: Option<String>,
    held_here: Option<bool>,
    limit: Option<usize>,
    after: Option<String>,
    full: bool,
}

impl Listing {
    /// Reads the query string; an unknown parameter or a bad value is an
    /// error naming it. A parameter with an empty value counts as absent.
    pub(crate) fn parse(query: Option<&str>) -> Result<Self, String> {
        let mut l = Listing::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            // An empty value is no value: the status page's form sends
            // `role=` and `partition=` when they are left blank.
            if v.is_empty() {
                continue;
            }
            let flag = |v: &str| match v {
                "true" | "1" | "yes" => Ok(true),
                "false" | "0" | "no" => Ok(false),
                _ => Err(format!("{k}={v}: expected true or false")),
            };
            match &*k {
                "role" => l.role = Some(v.into_owned()),
                "partition" => l.partition = Some(v.into_owned()),
                "held_here" => l.held_here = Some(flag(&v)?),
                "full" => l.full = flag(&v)?,
                "after" => l.after = Some(v.into_owned()),
                "limit" => match v.parse::<usize>() {
                    Ok(n) if n > 0 => l.limit = Some(n),
                    _ => return Err(format!("limit={v}: expected a number above 0")),
                },
                // A cache buster is harmless.
                "_" => {}
                other => {
                    return Err(format!(
                        "unknown parameter {other:?} (known: role, partition, held_here, limit, after, full)"
                    ))
                }
            }
        }
        Ok(l)
    }

    /// No parameter narrows or pages it: large partitions are summarised.
    fn is_default(&self) -> bool {
        self.role.is_none()
            && self.partition.is_none()
            && self.held_here.is_none()
            && self.limit.is_none()
            && self.after.is_none()
            && !self.full
    }

    /// The status page lists at most a page at a time.
    fn paged_for_page(mut self) -> Self {
        if !self.is_default() && self.limit.is_none() {
            self.limit = Some(PAGE_ROWS);
        }
        self
    }

    /// This listing with its cursor moved to `after`, as a query string.
    fn query_after(&self, after: &str) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(r) = &self.role {
            q.append_pair("role", r);
        }
        if let Some(p) = &self.partition {
            q.append_pair("partition", p);
        }
        if let Some(h) = self.held_here {
            q.append_pair("held_here", if h { "true" } else { "false" });
        }
        if self.full {
            q.append_pair("full", "true");
        }
        if let Some(n) = self.limit {
            q.append_pair("limit", &n.to_string());
        }
        q.append_pair("after", after);
        q.finish()
    }
}

/// Rows the status page shows at once.
const PAGE_ROWS: usize = 500;

#[derive(Serialize)]
pub(crate) struct MemberView {
    pub id: String,
    pub address: String,
    pub candidate: bool,
    /// How its route table differs from this instance's (empty: alike, or
    /// it published none).
    pub route_differences: Vec<String>,
}

/// One partition: how many of its roles this instance holds, and the fair
/// share bounds ⌊N/C⌋..⌈N/C⌉ over the live candidates when balanced.
#[derive(Serialize)]
pub(crate) struct PartitionView {
    pub name: String,
    pub count: u32,
    pub balanced: bool,
    pub held_here: usize,
    pub share: Option<[usize; 2]>,
    /// This instance's definition (count, hash version, scopes).
    pub definition: String,
    /// How it stands against the store's record: `serving`, `settling`,
    /// `mismatch` (neither held nor served here) or `unread`.
    pub state: &'static str,
    /// The definition the store records, and its epoch, once read.
    pub recorded: Option<String>,
    pub epoch: Option<u64>,
    /// While settling: the time left before the partition is served.
    pub settles_in_ms: Option<u64>,
    /// Whether this answer lists the partition's roles (a `/leases` without
    /// parameters summarises partitions of more than 256 roles).
    pub listed: bool,
    pub summary: PartitionSummary,
}

/// A partition's roles counted, as this instance sees them.
#[derive(Serialize, Default)]
pub(crate) struct PartitionSummary {
    /// Held by some live holder (here or elsewhere).
    pub held: usize,
    /// With no live holder.
    pub unheld: usize,
    /// Being handed over by this instance to their preferred holder.
    pub handing_over: usize,
    /// Requests waiting at this gateway for a holder of one of its roles.
    pub held_requests: usize,
    /// Roles per live holder id.
    pub by_holder: BTreeMap<String, usize>,
}

#[derive(Serialize)]
pub(crate) struct InstanceView {
    pub id: String,
    pub address: String,
    pub candidate: bool,
    /// Why the instance does not contend, when it was withdrawn with a reason
    /// (e.g. the app failing its health check).
    pub not_candidate_because: Option<String>,
    pub store: &'static str,
    pub ready: bool,
    pub draining: bool,
    /// Whether hop markers are signed (`proxy.cluster_secret` set). Every
    /// gateway of a cluster must say the same, with the same secret.
    pub hops_signed: bool,
}

#[derive(Serialize)]
pub(crate) struct RoleView {
    pub role: String,
    pub held_here: bool,
    pub token: u64,
    pub holder: Option<String>,
    pub holder_address: Option<String>,
    pub valid_for_ms: u64,
    /// The live candidate the role should end up with (balanced partitions).
    pub preferred: Option<String>,
    /// This instance is handing the role over to its preferred holder.
    pub handing_over: bool,
    /// Requests for the role waiting at this gateway for a servable holder.
    pub held_requests: usize,
}

/// The `/leases` document for `listing`; `held` counts the requests held
/// per role. An error names what in the listing is wrong.
pub(crate) fn leases_view(
    c: &Coordinator,
    hops_signed: bool,
    held: &HashMap<Arc<str>, usize>,
    listing: &Listing,
) -> Result<LeasesView, String> {
    let snap = c.snapshot();
    let now = Instant::now();
    let draining = c.is_draining();
    let role_view = |r: &crate::lease::RoleState| {
        let held_here = !draining && r.held_now(now);
        let (holder, address, valid_for) = if held_here {
            (
                Some(c.instance_id().to_string()),
                Some(c.advertise_address().to_string()),
                r.held_until
                    .map(|d| d.saturating_duration_since(now))
                    .unwrap_or_default(),
            )
        } else {
            match (&r.holder, &r.holder_address, r.holder_valid_until) {
                (Some(h), Some(a), Some(until)) if until > now => {
                    (Some(h.to_string()), Some(a.to_string()), until - now)
                }
                _ => (None, None, std::time::Duration::ZERO),
            }
        };
        RoleView {
            preferred: r.preferred.as_deref().map(str::to_string),
            handing_over: r.handing_over,
            held_requests: held.get(&r.name).copied().unwrap_or(0),
            role: r.name.to_string(),
            held_here,
            token: r.token,
            holder,
            holder_address: address,
            valid_for_ms: valid_for.as_millis() as u64,
        }
    };

    let partitions = c.partitions();
    let range = |p: &crate::lease::RolePartition| {
        let first = p.first_index().min(snap.roles.len());
        first..(first + p.count() as usize).min(snap.roles.len())
    };
    // Which roles the listing covers, by index into the snapshot.
    let mut indices: Vec<usize> = match (&listing.role, &listing.partition) {
        (Some(role), _) => snap
            .roles
            .iter()
            .position(|r| &*r.name == role.as_str())
            .into_iter()
            .collect(),
        (None, Some(name)) => {
            let p = partitions
                .iter()
                .find(|p| &**p.name() == name.as_str())
                .ok_or_else(|| format!("partition={name}: no such partition"))?;
            range(p).collect()
        }
        (None, None) => (0..snap.roles.len()).collect(),
    };
    if let (Some(name), Some(_)) = (&listing.partition, &listing.role) {
        // Both given: the role must be one of the partition's.
        indices.retain(|&i| snap.roles[i].name.starts_with(&format!("{name}:")));
    }
    let mut summarised = vec![false; partitions.len()];
    if listing.is_default() {
        for (k, p) in partitions.iter().enumerate() {
            if p.count() > LIST_AT_MOST {
                summarised[k] = true;
                let skip = range(p);
                indices.retain(|i| !skip.contains(i));
            }
        }
    }
    if let Some(want) = listing.held_here {
        indices.retain(|&i| (!draining && snap.roles[i].held_now(now)) == want);
    }
    let roles_total = indices.len();
    let start = match &listing.after {
        Some(after) => {
            indices
                .iter()
                .position(|&i| &*snap.roles[i].name == after.as_str())
                .ok_or_else(|| {
                    format!("after={after}: names no role of this listing (start again without it)")
                })?
                + 1
        }
        None => 0,
    };
    let end = listing.limit.map_or(indices.len(), |n| {
        start.saturating_add(n).min(indices.len())
    });
    let next =
        (end < indices.len() && end > start).then(|| snap.roles[indices[end - 1]].name.to_string());
    let roles = indices[start..end]
        .iter()
        .map(|&i| role_view(&snap.roles[i]))
        .collect();

    let mut partition_list = partition_views(&snap, &partitions);
    for (k, (view, p)) in partition_list.iter_mut().zip(&partitions).enumerate() {
        view.listed = !summarised[k];
        let summary = &mut view.summary;
        for r in &snap.roles[range(p)] {
            let live = if !draining && r.held_now(now) {
                Some(c.instance_id())
            } else {
                r.live_holder(now).map(|(h, _)| &**h)
            };
            match live {
                Some(h) => {
                    summary.held += 1;
                    *summary.by_holder.entry(h.to_string()).or_default() += 1;
                }
                None => summary.unheld += 1,
            }
            summary.handing_over += usize::from(r.handing_over);
            summary.held_requests += held.get(&r.name).copied().unwrap_or(0);
        }
    }

    Ok(LeasesView {
        instance: InstanceView {
            id: c.instance_id().to_string(),
            address: c.advertise_address().to_string(),
            candidate: c.is_candidate(),
            not_candidate_because: c.withdrawal().map(|w| w.to_string()),
            store: c.store_kind(),
            ready: c.is_ready(),
            draining,
            hops_signed,
        },
        members: snap
            .members
            .iter()
            .map(|m| MemberView {
                id: m.id.clone(),
                address: m.address.clone(),
                candidate: m.candidate,
                route_differences: crate::lease::route_differences(
                    c.routes_fingerprint(),
                    &m.routes,
                ),
            })
            .collect(),
        partitions: partition_list,
        roles,
        roles_total,
        next,
    })
}

fn partition_views(
    snap: &crate::lease::HolderSnapshot,
    partitions: &[crate::lease::RolePartition],
) -> Vec<PartitionView> {
    let candidates = snap.members.iter().filter(|m| m.candidate).count();
    partitions
        .iter()
        .map(|p| {
            let count = p.count() as usize;
            let held_here = p.held_here();
            let balanced = p.is_balanced();
            let share = (balanced && candidates > 0)
                .then(|| [count / candidates, count.div_ceil(candidates)]);
            let def = p.definition();
            let (state, recorded, epoch, settles_in) = match def.as_ref().map(|d| &d.state) {
                Some(DefinitionState::Serving { epoch }) => {
                    let here = def.as_ref().map(|d| d.configured.to_string());
                    ("serving", here, Some(*epoch), None)
                }
                Some(DefinitionState::Settling { epoch, until }) => {
                    let left = until.saturating_duration_since(Instant::now());
                    let here = def.as_ref().map(|d| d.configured.to_string());
                    (
                        "settling",
                        here,
                        Some(*epoch),
                        Some(left.as_millis() as u64),
                    )
                }
                Some(DefinitionState::Mismatch { epoch, recorded }) => {
                    ("mismatch", Some(recorded.to_string()), Some(*epoch), None)
                }
                Some(DefinitionState::Unread) | None => ("unread", None, None, None),
            };
            PartitionView {
                name: p.name().to_string(),
                count: p.count(),
                balanced,
                held_here,
                share,
                definition: def.map(|d| d.configured.to_string()).unwrap_or_default(),
                state,
                recorded,
                epoch,
                settles_in_ms: settles_in,
                listed: true,
                summary: PartitionSummary::default(),
            }
        })
        .collect()
}

#[derive(Clone)]
struct AdminState {
    coordinator: Coordinator,
    metrics: Option<PrometheusHandle>,
    hops_signed: bool,
    holds: Arc<Holds>,
}

impl AdminState {
    fn view(&self, listing: &Listing) -> Result<LeasesView, String> {
        leases_view(
            &self.coordinator,
            self.hops_signed,
            &self.holds.held_by_role(),
            listing,
        )
    }
}

impl axum::extract::FromRef<AdminState> for Coordinator {
    fn from_ref(s: &AdminState) -> Coordinator {
        s.coordinator.clone()
    }
}

pub(crate) fn router(
    coordinator: Coordinator,
    metrics: Option<PrometheusHandle>,
    hops_signed: bool,
    holds: Arc<Holds>,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/leases", get(leases))
        .route("/metrics", get(render_metrics))
        .route("/", get(status_page))
        .with_state(AdminState {
            coordinator,
            metrics,
            hops_signed,
            holds,
        })
}

async fn render_metrics(State(s): State<AdminState>) -> Response {
    let Some(handle) = &s.metrics else {
        return (StatusCode::NOT_FOUND, "metrics recorder not installed\n").into_response();
    };
    let c = &s.coordinator;
    metrics::gauge!(crate::telemetry::READY).set(if c.is_ready() { 1.0 } else { 0.0 });
    metrics::gauge!(crate::telemetry::CANDIDATE).set(if c.is_candidate() { 1.0 } else { 0.0 });
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
        .into_response()
}

async fn readyz(State(c): State<Coordinator>) -> Response {
    match c.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn leases(State(s): State<AdminState>, uri: axum::http::Uri) -> Response {
    let view = Listing::parse(uri.query()).and_then(|l| s.view(&l));
    match view {
        Ok(view) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            serde_json::to_string(&view).unwrap_or_default(),
        )
            .into_response(),
        Err(why) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::json!({ "error": why }).to_string(),
        )
            .into_response(),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn status_page(State(s): State<AdminState>, uri: axum::http::Uri) -> Html<String> {
    let (listing, problem) = match Listing::parse(uri.query()) {
        Ok(l) => (l.paged_for_page(), None),
        Err(why) => (Listing::default(), Some(why)),
    };
    let (v, listing, problem) = match s.view(&listing) {
        Ok(v) => (v, listing, problem),
        Err(why) => match s.view(&Listing::default()) {
            Ok(v) => (v, Listing::default(), Some(why)),
            Err(again) => return Html(format!("<p>{}</p>", escape(&again))),
        },
    };
    let mut rows = String::new();
    for r in &v.roles {
        rows.push_str(&format!(
            "<tr class=\"{cls}\"><td>{role}</td><td>{here}</td><td>{holder}</td><td>{addr}</td><td>{token}</td><td>{left}</td><td>{pref}</td><td>{waiting}</td></tr>\n",
            cls = if r.held_here { "here" } else if r.holder.is_some() { "other" } else { "none" },
            role = escape(&r.role),
            here = if r.held_here { "yes" } else { "" },
            holder = escape(r.holder.as_deref().unwrap_or("—")),
            addr = escape(r.holder_address.as_deref().unwrap_or("—")),
            token = r.token,
            left = if r.valid_for_ms > 0 { format!("{:.1} s", r.valid_for_ms as f64 / 1000.0) } else { "—".into() },
            pref = match (&r.preferred, r.handing_over) {
                (Some(p), true) => format!("{} (handing over)", escape(p)),
                (Some(p), false) => escape(p),
                (None, _) => "—".into(),
            },
            waiting = if r.held_requests > 0 { r.held_requests.to_string() } else { String::new() },
        ));
    }
    let (held, total) = {
        let snap = s.coordinator.snapshot();
        let now = Instant::now();
        let held = if v.instance.draining {
            0
        } else {
            snap.roles.iter().filter(|r| r.held_now(now)).count()
        };
        (held, snap.roles.len())
    };
    let waiting: usize = s.holds.held_by_role().values().sum();
    let listed = if listing.is_default() {
        String::new()
    } else {
        let next = match &v.next {
            Some(after) => format!(
                " · <a href=\"/?{}\">next {} →</a>",
                escape(&listing.query_after(after)),
                listing.limit.unwrap_or(PAGE_ROWS)
            ),
            None => String::new(),
        };
        format!(
            "<div class=\"meta\">{} of {} matching roles shown{next} · <a href=\"/\">summary</a></div>\n",
            v.roles.len(),
            v.roles_total
        )
    };
    let problem = problem
        .map(|p| format!("<div class=\"meta\"><b>{}</b></div>\n", escape(&p)))
        .unwrap_or_default();
    Html(format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="1">
<title>rolegate · {id}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:1rem;color:#222}}
table{{border-collapse:collapse;width:100%;font-size:.9rem}}
th,td{{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #ddd;word-break:break-all}}
tr.here td{{background:#e6f6e6}} tr.none td{{color:#a33}}
.meta{{color:#555;margin-bottom:1rem}}
</style></head><body>
<h1>rolegate</h1>
<div class="meta">instance <b>{id}</b> · {addr} · store {store} · {ready} · candidate: {cand}{drain} · holds {held} of {total} roles{waiting}</div>
{problem}{spread}{search}{listed}<table><thead><tr><th>role</th><th>held here</th><th>holder</th><th>address</th><th>token</th><th>time left</th><th>preferred</th><th>requests held</th></tr></thead>
<tbody>
{rows}</tbody></table>
</body></html>
"#,
        id = escape(&v.instance.id),
        addr = escape(&v.instance.address),
        store = v.instance.store,
        ready = if v.instance.ready {
            "ready"
        } else {
            "<b>NOT READY</b>"
        },
        cand = match (v.instance.candidate, &v.instance.not_candidate_because) {
            (true, _) => "yes".to_string(),
            (false, Some(why)) => format!("<b>no</b> ({})", escape(why)),
            (false, None) => "<b>no</b>".to_string(),
        },
        drain = if v.instance.draining {
            " · draining"
        } else {
            ""
        },
        waiting = if waiting > 0 {
            format!(" · <b>{waiting} requests held</b> waiting for a holder")
        } else {
            String::new()
        },
        spread = spread_html(&v),
        search = search_form(&v, &listing),
    ))
}

/// Finds a role, or lists a partition's roles a page at a time.
fn search_form(v: &LeasesView, listing: &Listing) -> String {
    let mut options = String::from("<option value=\"\">any</option>");
    for p in &v.partitions {
        let selected = if listing.partition.as_deref() == Some(p.name.as_str()) {
            " selected"
        } else {
            ""
        };
        options.push_str(&format!("<option{selected}>{}</option>", escape(&p.name)));
    }
    let checked = if listing.held_here == Some(true) {
        " checked"
    } else {
        ""
    };
    format!(
        "<form class=\"meta\" method=\"get\" action=\"/\">role <input name=\"role\" value=\"{role}\" placeholder=\"exact name\"> partition <select name=\"partition\">{options}</select> <label><input type=\"checkbox\" name=\"held_here\" value=\"true\"{checked}> held here</label> <button>show</button></form>\n",
        role = escape(listing.role.as_deref().unwrap_or("")),
    )
}

/// Live members and each partition's share, above the role table.
fn spread_html(v: &LeasesView) -> String {
    let mut out = String::new();
    if !v.members.is_empty() {
        let members: Vec<String> = v
            .members
            .iter()
            .map(|m| {
                let cand = if m.candidate {
                    ""
                } else {
                    " (not a candidate)"
                };
                let routes = if m.route_differences.is_empty() {
                    String::new()
                } else {
                    format!(
                        " <b>(routes differ: {})</b>",
                        escape(&m.route_differences.join("; "))
                    )
                };
                format!("{}{cand}{routes}", escape(&m.id))
            })
            .collect();
        out.push_str(&format!(
            "<div class=\"meta\">members: {}</div>\n",
            members.join(", ")
        ));
    }
    for p in &v.partitions {
        let share = match p.share {
            Some([lo, hi]) => format!(" (fair share {lo}..{hi})"),
            None if p.balanced => String::new(),
            None => " (not balanced)".into(),
        };
        let standing = match (p.state, &p.recorded) {
            ("mismatch", Some(r)) => format!(
                " · <b>MISMATCH</b>: defined here as <code>{}</code>, the store records <code>{}</code>; not served here",
                escape(&p.definition),
                escape(r)
            ),
            ("settling", _) => format!(
                " · settling after a change: served in {:.1} s",
                p.settles_in_ms.unwrap_or(0) as f64 / 1000.0
            ),
            ("unread", _) => " · definition not read from the store yet".to_string(),
            _ => String::new(),
        };
        let holders: Vec<String> = p
            .summary
            .by_holder
            .iter()
            .map(|(h, n)| format!("{} {n}", escape(h)))
            .collect();
        let counts = format!(
            " · held {} ({}), no holder {}{}",
            p.summary.held,
            if holders.is_empty() {
                "none".to_string()
            } else {
                holders.join(", ")
            },
            p.summary.unheld,
            if p.summary.held_requests > 0 {
                format!(" · <b>{} requests held</b>", p.summary.held_requests)
            } else {
                String::new()
            }
        );
        let list = if p.listed {
            String::new()
        } else {
            format!(
                " · <a href=\"/?partition={}\">list its roles</a>",
                escape(&form_urlencoded::byte_serialize(p.name.as_bytes()).collect::<String>())
            )
        };
        out.push_str(&format!(
            "<div class=\"meta\">partition <b>{}</b>: {} of {} held here{share}{counts}{standing}{list}</div>\n",
            escape(&p.name),
            p.held_here,
            p.count
        ));
    }
    out
}

/// Admin connections served at once; more wait in the backlog.
const ADMIN_MAX_CONNECTIONS: usize = 64;

/// Serves the admin router until `stop` turns true. Like the public listener
/// it has a header read timeout and a connection cap, so slow or idle clients
/// cannot hold it: `/readyz` keeps answering.
pub(crate) async fn serve(
    listener: TcpListener,
    coordinator: Coordinator,
    metrics: Option<PrometheusHandle>,
    hops_signed: bool,
    holds: Arc<Holds>,
    mut stop: crate::shutdown::Shutdown,
) {
    let app = router(coordinator, metrics, hops_signed, holds);
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(ADMIN_MAX_CONNECTIONS));
    let mut accept_errors = crate::listener::AcceptBackoff::default();
    loop {
        let next =
            crate::listener::next_connection(&listener, &slots, &mut accept_errors, &mut stop);
        let Some((stream, _, slot)) = next.await else {
            return;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(crate::listener::ADMIN_HEADER_READ_TIMEOUT)
                .max_buf_size(crate::listener::MAX_HEAD_BYTES)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::pin!(conn);
            let idle = std::time::Duration::from_secs(60);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = tokio::time::sleep(idle) => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
                _ = stop.recv() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "admin connection ended with an error");
            }
        });
    }
}
