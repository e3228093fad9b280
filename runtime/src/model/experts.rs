//! Mixture-of-experts weights on the device, and the expert cache.
//!
//! Every expert's matrices live in two pools on the device, one matrix per slot: the
//! stacked gate·up (gate rows, then up rows) and the down projection. `slot_of[layer]
//! [expert]` says which slot holds an expert, and the expert kernels read it, so one set
//! of kernels serves both placements:
//!
//! - **Resident**: slot `layer · experts + expert`, filled once; forward passes are
//!   captured as graphs like a dense model's.
//! - **Cached**: fewer slots than experts. All experts stay in page-locked host memory;
//!   after each layer's routing the host reads the window's chosen experts, uploads the
//!   missing ones on the copy queue into slots the policy frees (never one this layer
//!   reads), and prefetches, while the layer computes, the experts the previous pass chose
//!   in the next layer. Passes run uncaptured (the host decides between kernels).

use std::time::Instant;

use strata_compiler::model::ModelDesc;
use strata_compiler::ops::RouteLayout;
use strata_compiler::pack::Pack;
use strata_compiler::quant::GgmlType;

use crate::backend::{Backend, BufferId, HostId, RunError};

/// Which cached expert gives way to a missing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The least recently used.
    Lru,
    /// The least frequently used, counts halving every [`LFU_HALF_LIFE`] passes.
    Lfu,
}

impl std::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Policy, String> {
        match s {
            "lru" => Ok(Policy::Lru),
            "lfu" => Ok(Policy::Lfu),
            _ => Err(format!("{s:?} is not lru or lfu")),
        }
    }
}

/// Passes after which an LFU use counts half.
pub const LFU_HALF_LIFE: f64 = 16.0;

/// How much device memory the experts get.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheSize {
    /// Every expert, if the device budget holds them; else what the budget leaves.
    Auto,
    /// This many MiB of expert slots.
    Mib(u64),
    /// This share (0 to 100) of the pack's expert bytes.
    Percent(f64),
}

impl std::str::FromStr for CacheSize {
    type Err = String;

    fn from_str(s: &str) -> Result<CacheSize, String> {
        let bad = || format!("{s:?} is not auto, a size in MiB or a percentage like 25%");
        match s.strip_suffix('%') {
            _ if s == "auto" => Ok(CacheSize::Auto),
            Some(p) => match p.parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => Ok(CacheSize::Percent(p)),
                _ => Err(bad()),
            },
            None => s.parse().map(CacheSize::Mib).map_err(|_| bad()),
        }
    }
}

/// Where the experts go (`--expert-cache`, `--expert-policy`, `--vram-budget`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertOptions {
    /// Size of the expert pools.
    pub cache: CacheSize,
    /// The cache's eviction policy.
    pub policy: Policy,
    /// Device memory the model may use in all, MiB (default: 90% of the device's).
    pub vram_budget_mib: Option<u64>,
}

impl Default for ExpertOptions {
    fn default() -> Self {
        ExpertOptions { cache: CacheSize::Auto, policy: Policy::Lfu, vram_budget_mib: None }
    }
}

/// The cache's counters since the last [`Experts::take_stats`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertStats {
    /// Tokens run.
    pub tokens: u64,
    /// Experts a layer's window needed.
    pub lookups: u64,
    /// Of those, already in a slot (uploaded earlier or prefetched).
    pub hits: u64,
    /// Bytes uploaded (misses and prefetches).
    pub uploaded: u64,
    /// Experts prefetched.
    pub prefetched: u64,
    /// Seconds the kernels waited for uploads.
    pub stall: f64,
}

impl ExpertStats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &ExpertStats) {
        self.tokens += other.tokens;
        self.lookups += other.lookups;
        self.hits += other.hits;
        self.uploaded += other.uploaded;
        self.prefetched += other.prefetched;
        self.stall += other.stall;
    }

    /// Hits per lookup (1 with nothing looked up).
    pub fn hit_rate(&self) -> f64 {
        if self.lookups == 0 { 1.0 } else { self.hits as f64 / self.lookups as f64 }
    }

    /// MiB uploaded per token.
    pub fn mib_per_token(&self) -> f64 {
        self.uploaded as f64 / (1 << 20) as f64 / self.tokens.max(1) as f64
    }

    /// Milliseconds of upload stall per token.
    pub fn stall_ms_per_token(&self) -> f64 {
        self.stall * 1e3 / self.tokens.max(1) as f64
    }
}

/// How the experts were placed, for logs and `/metrics`.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Slots on the device.
    pub slots: u32,
    /// Experts of all layers.
    pub experts: u32,
    /// Bytes of all experts.
    pub bytes: u64,
    /// Measured host-to-device bandwidth, bytes/s (cached placements only).
    pub pcie: Option<f64>,
    /// The eviction policy (cached placements).
    pub policy: Policy,
}

impl Placement {
    /// Whether every expert has a slot.
    pub fn resident(&self) -> bool {
        self.slots >= self.experts
    }
}

/// One pool: matrices of `bytes` each, one per slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pool {
    pub buf: BufferId,
    pub ty: GgmlType,
    pub bytes: usize,
}

/// The experts of a pack on a backend.
pub(super) struct Experts {
    /// Per layer, the pools its experts are in (one per layer when resident; one shared
    /// by every layer when cached).
    pub gate_up: Vec<Pool>,
    pub down: Vec<Pool>,
    /// `[layer][expert]` → slot of the layer's pools, i32.
    pub slot_of: BufferId,
    /// Slots of each pool.
    pub pool_slots: u32,
    pub count: u32,
    pub used: u32,
    /// The widest pass whose experts the slots hold at once.
    pub max_window: u32,
    pub placement: Placement,
    cache: Option<Cache>,
    stats: ExpertStats,
}

/// The host side of a cached placement.
struct Cache {
    /// Every expert's gate·up and down matrices, `[layer][expert]`.
    host_gate_up: HostId,
    host_down: HostId,
    /// Per slot: the (layer, expert) in it.
    owner: Vec<Option<(u32, u32)>>,
    /// Per `layer · count + expert`: its slot.
    slot: Vec<Option<u32>>,
    /// Per slot: last use (LRU) or decayed use count and when it was last decayed (LFU).
    last_use: Vec<u64>,
    uses: Vec<f64>,
    /// Per slot: read by the layer being run (not to be given away).
    locked: Vec<bool>,
    /// Per layer: the experts the last pass chose there (the next pass's prefetch guess).
    last_union: Vec<Vec<u32>>,
    policy: Policy,
    /// Layer lookups so far (the LRU clock).
    clock: u64,
    layers: u32,
}

/// The tensor's bytes per expert, after checking it is a 3-D stack of `count`.
fn per_expert(pack: &Pack, name: &str, count: u32) -> Result<(GgmlType, usize), RunError> {
    let t = pack.tensor(name).ok_or_else(|| RunError::Other(format!("tensor {name} is missing")))?;
    if t.shape.len() != 3 || t.shape[2] != u64::from(count) || t.bytes % u64::from(count) != 0 {
        return Err(RunError::Other(format!("tensor {name}: shape {:?} is not a stack of {count} experts", t.shape)));
    }
    Ok((t.ty, (t.bytes / u64::from(count)) as usize))
}

impl Experts {
    /// Places the experts of `pack` on `backend` as `opts` say: every expert resident
    /// where the budget holds them, else a cache of slots (at least `min_slots`, one pass's
    /// widest union of experts; narrower passes where the slots hold fewer: see
    /// `max_window`). `other_bytes` is what the rest of the model takes.
    pub fn load(
        pack: &Pack,
        desc: &ModelDesc,
        b: &mut dyn Backend,
        opts: &ExpertOptions,
        window: u32,
        other_bytes: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Experts, RunError> {
        let shape = desc.experts.ok_or_else(|| RunError::Other("not a mixture-of-experts pack".into()))?;
        let (count, layers) = (shape.count, desc.layers);
        let name = |l: u32, n: &str| format!("blk.{l}.{n}.weight");
        // Per layer: (gate and up type, bytes of one expert's gate; down type, bytes).
        let kinds = (0..layers)
            .map(|l| {
                let (gate, up) = (per_expert(pack, &name(l, "ffn_gate_exps"), count)?, per_expert(pack, &name(l, "ffn_up_exps"), count)?);
                if gate != up {
                    return Err(RunError::Other(format!(
                        "tensor {}: its type {} differs from the gate's {}: the experts' gate and up are one stacked product",
                        name(l, "ffn_up_exps"),
                        up.0,
                        gate.0
                    )));
                }
                let down = per_expert(pack, &name(l, "ffn_down_exps"), count)?;
                Ok((gate.0, gate.1, down.0, down.1))
            })
            .collect::<Result<Vec<_>, RunError>>()?;
        let expert_bytes = |(_, g, _, d): (GgmlType, usize, GgmlType, usize)| (2 * g + d) as u64;
        let total = u64::from(layers * count);
        let all_bytes: u64 = kinds.iter().map(|&k| expert_bytes(k) * u64::from(count)).sum();
        let mean = all_bytes / total.max(1);
        let fits = |budget_bytes: u64| budget_bytes / mean.max(1);
        let wanted = match opts.cache {
            CacheSize::Mib(m) => fits(m << 20),
            CacheSize::Percent(p) => (total as f64 * p / 100.0).floor() as u64,
            CacheSize::Auto => {
                let device = b.info().memory;
                let budget = opts.vram_budget_mib.map(|m| m << 20).unwrap_or(device / 10 * 9);
                if budget == 0 { total } else { fits(budget.saturating_sub(other_bytes)) }
            }
        };
        let slots = wanted.min(total) as u32;
        let mib = |n: u64| n as f64 / (1 << 20) as f64;
        // The widest pass whose experts fit the slots: a pass's union must be resident at
        // once, so a small cache takes prompts in narrower passes.
        let layout = RouteLayout::new(count, shape.used);
        let max_window = (1..=window.max(1)).rev().find(|&w| layout.union(w) <= slots).unwrap_or(0);
        if max_window == 0 {
            let need = layout.union(1);
            return Err(RunError::Other(format!(
                "the expert budget holds {slots} experts ({:.1} MiB), but one layer's experts for one token need {need} ({:.1} MiB, {:.2} MiB each); all {total} experts take {:.1} MiB: raise --expert-cache or --vram-budget",
                mib(u64::from(slots) * mean),
                mib(u64::from(need) * mean),
                mib(mean),
                mib(all_bytes),
            )));
        }
        let resident = u64::from(slots) == total;
        if !resident && let Some(l) = kinds.iter().position(|k| *k != kinds[0]) {
            return Err(RunError::Other(format!(
                "layer {l}'s experts are stored as {} and {}, layer 0's as {} and {}: a cache of experts shared by the layers needs one layout; keep them all resident (--expert-cache auto with enough --vram-budget)",
                kinds[l].0, kinds[l].2, kinds[0].0, kinds[0].2
            )));
        }
        // Resident: a pool per layer, slot = expert. Cached: one pool shared by the layers.
        let pools = if resident { layers } else { 1 };
        let pool_slots = if resident { count } else { slots };
        let mut gate_up = Vec::with_capacity(layers as usize);
        let mut down = Vec::with_capacity(layers as usize);
        for &(gt, gb, dt, db) in &kinds[..pools as usize] {
            gate_up.push(Pool { buf: b.alloc(pool_slots as usize * 2 * gb)?, ty: gt, bytes: 2 * gb });
            down.push(Pool { buf: b.alloc(pool_slots as usize * db)?, ty: dt, bytes: db });
        }
        if !resident {
            gate_up.resize(layers as usize, gate_up[0]);
            down.resize(layers as usize, down[0]);
        }
        let slot_of = b.alloc((layers * count) as usize * 4)?;
        let placement = Placement { slots, experts: layers * count, bytes: all_bytes, pcie: None, policy: opts.policy };
        let mut experts = Experts {
            gate_up,
            down,
            slot_of,
            pool_slots,
            count,
            used: shape.used,
            max_window,
            placement,
            cache: None,
            stats: ExpertStats::default(),
        };
        // Expert `e` of layer `l`'s matrices: gate, up, down.
        let matrices = |l: u32, e: usize| -> [&[u8]; 3] {
            let (_, gb, _, db) = kinds[l as usize];
            let part = |n: &str, bytes: usize| {
                let t = pack.tensor(&name(l, n)).map(|t| pack.data(t)).unwrap_or_default();
                t.get(e * bytes..(e + 1) * bytes).unwrap_or_default()
            };
            [part("ffn_gate_exps", gb), part("ffn_up_exps", gb), part("ffn_down_exps", db)]
        };
        if resident {
            for l in 0..layers {
                let (gu, d) = (experts.gate_up[l as usize], experts.down[l as usize]);
                for e in 0..count as usize {
                    let [g, u, dm] = matrices(l, e);
                    b.write(gu.buf, e * gu.bytes, g)?;
                    b.write(gu.buf, e * gu.bytes + g.len(), u)?;
                    b.write(d.buf, e * d.bytes, dm)?;
                }
                progress(expert_bytes(kinds[l as usize]) * u64::from(count));
            }
            let table: Vec<u8> = (0..layers).flat_map(|_| 0..count as i32).flat_map(|s| s.to_le_bytes()).collect();
            b.write(slot_of, 0, &table)?;
            return Ok(experts);
        }
        // Cached: every expert in host memory, then each layer's share of the slots.
        let (gu, d) = (experts.gate_up[0], experts.down[0]);
        let host_gate_up = b.alloc_host(total as usize * gu.bytes)?;
        let host_down = b.alloc_host(total as usize * d.bytes)?;
        for l in 0..layers {
            for e in 0..count as usize {
                let i = (l * count) as usize + e;
                let [g, u, dm] = matrices(l, e);
                let host = b.host_mut(host_gate_up);
                host[i * gu.bytes..i * gu.bytes + g.len()].copy_from_slice(g);
                host[i * gu.bytes + g.len()..(i + 1) * gu.bytes].copy_from_slice(u);
                b.host_mut(host_down)[i * d.bytes..(i + 1) * d.bytes].copy_from_slice(dm);
            }
            progress(expert_bytes(kinds[l as usize]) * u64::from(count));
        }
        experts.placement.pcie = Some(probe(b, host_gate_up, gu, total as usize)?);
        let s = slots as usize;
        let mut cache = Cache {
            host_gate_up,
            host_down,
            owner: vec![None; s],
            slot: vec![None; total as usize],
            last_use: vec![0; s],
            uses: vec![0.0; s],
            locked: vec![false; s],
            last_union: vec![Vec::new(); layers as usize],
            policy: opts.policy,
            clock: 0,
            layers,
        };
        // Each layer starts with an equal share: slot i holds expert i / layers of layer
        // i % layers.
        for i in 0..slots {
            let (l, e) = (i % layers, i / layers);
            cache.fill(b, &experts, i, l, e)?;
        }
        b.await_uploads()?;
        b.sync()?;
        let table: Vec<u8> = cache.slot.iter().flat_map(|s| s.map_or(-1, |s| s as i32).to_le_bytes()).collect();
        b.write(slot_of, 0, &table)?;
        experts.cache = Some(cache);
        Ok(experts)
    }

    /// Whether forward passes must stop after each layer's routing (a cached placement).
    pub fn cached(&self) -> bool {
        self.cache.is_some()
    }

    /// For a cached placement, after layer `layer`'s routing is queued in `route`: reads
    /// the window's experts, uploads the missing ones into free slots,
    /// points the layer's `slot_of` row at them, makes the kernels wait for the uploads,
    /// and prefetches the next layer's guess. Nothing for a resident placement.
    pub fn prepare_layer(&mut self, b: &mut dyn Backend, layer: u32, route: BufferId) -> Result<(), RunError> {
        let Some(mut cache) = self.cache.take() else { return Ok(()) };
        let result = self.prepare_with(&mut cache, b, layer, route);
        self.cache = Some(cache);
        result
    }

    fn prepare_with(
        &mut self,
        c: &mut Cache,
        b: &mut dyn Backend,
        layer: u32,
        route: BufferId,
    ) -> Result<(), RunError> {
        let cap = RouteLayout::new(self.count, self.used).capacity as usize;
        let mut raw = vec![0u8; (1 + cap) * 4];
        b.read(route, 0, &mut raw)?;
        let ints: Vec<i32> = raw.chunks_exact(4).map(|x| i32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect();
        let n = (ints[0].max(0) as usize).min(cap);
        let union: Vec<u32> =
            ints[1..=n].iter().filter_map(|&e| u32::try_from(e).ok()).filter(|&e| e < self.count).collect();
        c.clock += 1;
        c.locked.iter_mut().for_each(|l| *l = false);
        // Hits first (locked, so that no miss of this layer gives their slots away).
        let slot_index = |e: u32| (layer * self.count + e) as usize;
        for &e in &union {
            self.stats.lookups += 1;
            if let Some(s) = c.slot[slot_index(e)] {
                self.stats.hits += 1;
                c.locked[s as usize] = true;
                c.touch(s);
            }
        }
        for &e in &union {
            if c.slot[slot_index(e)].is_none() {
                let s = c.victim().ok_or_else(|| {
                    RunError::Other(format!("expert cache: no free slot for layer {layer} ({} slots)", self.pool_slots))
                })?;
                c.fill(b, self, s, layer, e)?;
                c.locked[s as usize] = true;
                c.touch(s);
                self.stats.uploaded += (self.gate_up[0].bytes + self.down[0].bytes) as u64;
            }
        }
        let row: Vec<u8> =
            (0..self.count).flat_map(|e| c.slot[slot_index(e)].map_or(-1, |s| s as i32).to_le_bytes()).collect();
        b.write(self.slot_of, slot_index(0) * 4, &row)?;
        b.await_uploads()?;
        c.last_union[layer as usize] = union;
        // Prefetch what the last pass chose in the next layer, while this one computes,
        // into slots this layer does not read.
        let next = (layer + 1) % c.layers;
        for e in c.last_union[next as usize].clone() {
            let i = (next * self.count + e) as usize;
            if c.slot[i].is_some() {
                continue;
            }
            let Some(s) = c.victim() else { break };
            c.fill(b, self, s, next, e)?;
            c.locked[s as usize] = true;
            c.touch(s);
            self.stats.prefetched += 1;
            self.stats.uploaded += (self.gate_up[0].bytes + self.down[0].bytes) as u64;
        }
        Ok(())
    }

    /// Counts `tokens` run (for per-token figures) and the stall of the uploads the last
    /// passes waited for.
    pub fn end_pass(&mut self, b: &mut dyn Backend, tokens: u32) -> Result<(), RunError> {
        self.stats.tokens += u64::from(tokens);
        if self.cached() {
            self.stats.stall += b.upload_stall()?;
        }
        Ok(())
    }

    /// The counters since the last call, reset.
    pub fn take_stats(&mut self) -> ExpertStats {
        std::mem::take(&mut self.stats)
    }
}

impl Cache {
    /// The slot to give away: an empty one, else the policy's choice among those not
    /// locked (read by the layer being run, or prefetched for the next).
    fn victim(&self) -> Option<u32> {
        let score = |s: usize| match self.policy {
            Policy::Lru => self.last_use[s] as f64,
            Policy::Lfu => self.decayed(s),
        };
        let free = self.owner.iter().position(Option::is_none);
        let pick = free.or_else(|| {
            (0..self.owner.len()).filter(|&s| !self.locked[s]).min_by(|&a, &b| score(a).total_cmp(&score(b)))
        });
        pick.map(|s| s as u32)
    }

    /// LFU's use count of slot `s`, decayed to now.
    fn decayed(&self, s: usize) -> f64 {
        let passes = (self.clock - self.last_use[s]) as f64 / f64::from(self.layers);
        self.uses[s] * 0.5f64.powf(passes / LFU_HALF_LIFE)
    }

    fn touch(&mut self, s: u32) {
        let s = s as usize;
        self.uses[s] = self.decayed(s) + 1.0;
        self.last_use[s] = self.clock;
    }

    /// Uploads expert `e` of layer `l` into slot `s` (evicting its owner).
    fn fill(&mut self, b: &mut dyn Backend, x: &Experts, s: u32, l: u32, e: u32) -> Result<(), RunError> {
        if let Some((ol, oe)) = self.owner[s as usize].take() {
            self.slot[(ol * x.count + oe) as usize] = None;
        }
        let i = (l * x.count + e) as usize;
        let (gu, d) = (x.gate_up[0], x.down[0]);
        b.upload(self.host_gate_up, i * gu.bytes, gu.buf, s as usize * gu.bytes, gu.bytes)?;
        b.upload(self.host_down, i * d.bytes, d.buf, s as usize * d.bytes, d.bytes)?;
        self.owner[s as usize] = Some((l, e));
        self.slot[i] = Some(s);
        self.uses[s as usize] = 0.0;
        Ok(())
    }
}

/// Host-to-device bandwidth, bytes/s: up to 256 MiB of `host` uploaded into `pool`.
fn probe(b: &mut dyn Backend, host: HostId, pool: Pool, matrices: usize) -> Result<f64, RunError> {
    let n = (256usize << 20).div_ceil(pool.bytes).min(matrices).min(b.size(pool.buf) / pool.bytes).max(1);
    b.sync()?;
    let start = Instant::now();
    for i in 0..n {
        b.upload(host, i * pool.bytes, pool.buf, i * pool.bytes, pool.bytes)?;
    }
    b.await_uploads()?;
    b.sync()?;
    let seconds = start.elapsed().as_secs_f64();
    let _ = b.upload_stall()?;
    Ok((n * pool.bytes) as f64 / seconds.max(1e-9))
}
