//! One lease, end to end, through the real market rules in one process: a provider signs an
//! offer, a renter ingests it, proposes terms, the provider checks and signs them, the provider
//! meters 95 s of use in 10 s reports, the renter pays with cumulative receipts, and both
//! statements are printed. No network and no container: those are the node's and the sandbox's.
//!
//! `cargo run -p gridlease-contracts --example lease_walkthrough`
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use gridlease_contracts::ingest::OfferIngestor;
use gridlease_contracts::{
    Actor, Lease, LeaseEvent, Money, ProviderChannel, ProviderView, RenterChannel, Tariff,
    check_accept, check_request,
};
use gridlease_protocol::fixtures::{self, T0};
use gridlease_protocol::{
    CloseReason, LeaseAccept, LeaseRequest, NetworkId, NodeKey, OfferId, Signed,
};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let net = NetworkId::devnet();
    let provider = NodeKey::generate();
    let renter = NodeKey::generate();
    println!(
        "provider {}\nrenter   {}\n",
        provider.peer_id(),
        renter.peer_id()
    );

    // 1. The provider signs an offer: 2 declared RTX 4090 at 0.40 per GPU-hour.
    let offer = fixtures::offer(provider.public(), 1, 2, "0.40".parse::<Money>()?.micros());
    let frame = Signed::sign(&provider, &net, &offer)?.to_bytes()?;
    println!(
        "offer: {} bytes on the wire, {} GPUs, {}/GPU-hour",
        frame.len(),
        offer.gpus.len(),
        Money::from_micros(offer.price_per_gpu_hour)
    );

    // 2. The renter's node ingests it from gossip: strict signature check, then the rules.
    let mut ingest = OfferIngestor::new(net.clone(), 1024);
    let now = T0.plus_secs(1);
    let verified = ingest.ingest(&frame, now)?;
    let offer_id = OfferId(verified.digest);
    println!("offer {} verified and valid", offer_id.short());

    // 3. The renter proposes terms for 1 GPU for 10 minutes.
    let mut terms = fixtures::terms(offer_id, &verified.message, renter.public(), 1, 600);
    terms.created_at = now;
    let request = LeaseRequest {
        terms: terms.clone(),
        expires_at: now.plus_secs(30),
    };
    let signed_request = Signed::sign(&renter, &net, &request)?;

    // 4. The provider verifies the request, applies the rules, signs the same terms.
    let req = signed_request.verify(&net)?;
    let view = ProviderView {
        network: &net,
        offer: &offer,
        offer_id,
        equivalent: &[],
        free_gpus: 2,
        now,
        images: &gridlease_contracts::image::ImagePolicy::default(),
    };
    let lease_id =
        check_request(&view, &req.message, &req.signer).map_err(|r| format!("rejected: {r:?}"))?;
    let accept = LeaseAccept {
        lease_id,
        terms: req.message.terms.clone(),
        gpus: vec![offer.gpus[0].spec.uuid_digest],
        accepted_at: now,
    };
    let signed_accept = Signed::sign(&provider, &net, &accept)?;
    let acc = signed_accept.verify(&net)?;
    check_accept(&terms, &acc.message, &acc.signer)?;
    println!(
        "lease {} agreed: both signed the same terms\n",
        lease_id.short()
    );

    // 5. The container runs 95 s; every 10 s a usage report, answered by a receipt.
    let mut lease = Lease::propose(lease_id, terms.clone());
    lease.apply(LeaseEvent::Accept, Actor::Provider, now)?;
    lease.apply(LeaseEvent::BeginStart, Actor::Provider, now)?;
    lease.apply(LeaseEvent::Started, Actor::Provider, now)?;
    let tariff = Tariff::of(&terms);
    let mut p_chan = ProviderChannel::new(lease_id, &terms, now);
    let mut r_chan = RenterChannel::new(lease_id, terms.clone());
    let mut provider_booked = Money::ZERO;
    println!("{:>4} {:>8} {:>12} {:>12}", "seq", "wall s", "due", "paid");
    let ran_ms = 95_000u64;
    let mut seq = 0;
    let mut wall = 0;
    while wall < ran_ms {
        wall = (wall + 10_000).min(ran_ms);
        seq += 1;
        let mut usage = fixtures::usage(lease_id, seq, wall, 1);
        let done = wall == ran_ms;
        usage.exit_code = done.then_some(0);
        usage.amount_due = if done {
            tariff.final_due(wall)?
        } else {
            tariff.due(wall)?
        }
        .micros();
        let at = now.plus_ms(wall);
        let signed_usage = Signed::sign(&provider, &net, &usage)?.verify(&net)?;
        if let Some(receipt) =
            r_chan.on_usage(&signed_usage.message, &signed_usage.signer, wall, at)?
        {
            let signed_receipt = Signed::sign(&renter, &net, &receipt)?.verify(&net)?;
            provider_booked = provider_booked.checked_add(p_chan.accept_receipt(
                &signed_receipt.signer,
                &signed_receipt.message,
                at,
            )?)?;
        }
        println!(
            "{seq:>4} {:>8} {:>12} {:>12}",
            wall / 1000,
            Money::from_micros(usage.amount_due),
            p_chan.paid()
        );
    }
    lease.apply(
        LeaseEvent::Close(CloseReason::ContainerExited),
        Actor::Provider,
        now.plus_ms(ran_ms),
    )?;
    lease.apply(
        LeaseEvent::Settle {
            total: p_chan.paid(),
        },
        Actor::Provider,
        now.plus_ms(ran_ms),
    )?;

    println!("\nfinal statement (provider): {}", p_chan.paid());
    println!("final statement (renter):   {}", r_chan.paid());
    println!("booked by provider:         {provider_booked}");
    println!(
        "0.40/GPU-h x 1 GPU x 95 s = {}",
        gridlease_contracts::cost(95, 1, "0.40".parse()?)?
    );
    println!("lease state: {}", lease.state.as_str());
    if p_chan.paid() != r_chan.paid() || provider_booked != p_chan.paid() {
        return Err("ledgers disagree".into());
    }
    Ok(())
}
