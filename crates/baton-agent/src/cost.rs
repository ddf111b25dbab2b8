//! Tokens and cost: the meters a model call reserves before it is sent and
//! is charged once it settles.
//!
//! Every call reserves the worst case of four meters: `tokens_out` (the
//! request's `max_tokens`), `tokens_in` (a bound on the prompt, see
//! [`input_bound`]), `tokens` (their sum) and, when the model has a
//! [`Price`], `cost_micros`. The kernel refuses a reservation the budget
//! cannot cover before any I/O (`engine.limit.meter`). A settled call is
//! charged what the provider reported, capped by the kernel at the
//! reservation; a call whose usage the provider did not report is charged
//! its whole reservation.

use std::collections::BTreeMap;

use baton_run::{Meters, Name};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::chat::{Part, Request, Usage};

/// The meter of input (prompt) tokens.
pub const TOKENS_IN: &str = "tokens_in";
/// The meter of output (generated) tokens, reasoning included.
pub const TOKENS_OUT: &str = "tokens_out";
/// The meter of all tokens: `tokens_in` plus `tokens_out`.
pub const TOKENS: &str = "tokens";
/// The meter of cost, in millionths of the price table's currency unit.
pub const COST_MICROS: &str = "cost_micros";

/// Input tokens counted for each media part (an image) of a request.
pub const MEDIA_TOKENS: u64 = 2_000;
/// Input tokens counted once for a request that declares tools, for the
/// instructions providers add around tool definitions.
pub const TOOLS_TOKENS: u64 = 1_000;

/// What one model's tokens cost, in millionths of a currency unit per
/// million tokens (so `2_500_000` is 2.50 per million tokens). Cached input
/// and reasoning tokens cost what plain input and output tokens cost unless
/// priced themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Per million input tokens.
    pub input: u64,
    /// Per million input tokens read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<u64>,
    /// Per million output tokens.
    pub output: u64,
    /// Per million reasoning tokens (part of the output tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<u64>,
}

/// Prices by model name, as a provider configuration holds them.
pub type PriceTable = BTreeMap<String, Price>;

const MILLION: u128 = 1_000_000;

fn ceil_micros(sum: u128) -> u64 {
    u64::try_from(sum.div_ceil(MILLION)).unwrap_or(u64::MAX)
}

impl Price {
    /// A price of `input` and `output` per million tokens, with cached input
    /// and reasoning tokens at those prices.
    pub fn per_million(input: u64, output: u64) -> Price {
        Price {
            input,
            cached_input: None,
            output,
            reasoning: None,
        }
    }

    /// The cost of reported usage: ⌈Σ tokens × price ÷ 10⁶⌉ over uncached
    /// input, cached input, non-reasoning output and reasoning tokens.
    pub fn cost_micros(&self, usage: &Usage) -> u64 {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let reasoning = usage.reasoning_tokens.min(usage.output_tokens);
        let terms = [
            (usage.input_tokens - cached, self.input),
            (cached, self.cached_input.unwrap_or(self.input)),
            (usage.output_tokens - reasoning, self.output),
            (reasoning, self.reasoning.unwrap_or(self.output)),
        ];
        ceil_micros(
            terms
                .iter()
                .map(|(tokens, price)| u128::from(*tokens) * u128::from(*price))
                .sum(),
        )
    }

    /// The most `input` and `output` tokens can cost: each at the dearest
    /// price it may be charged.
    pub fn max_cost_micros(&self, input: u64, output: u64) -> u64 {
        let input_price = self.input.max(self.cached_input.unwrap_or(0));
        let output_price = self.output.max(self.reasoning.unwrap_or(0));
        ceil_micros(
            u128::from(input) * u128::from(input_price)
                + u128::from(output) * u128::from(output_price),
        )
    }
}

/// A bound on a request's input tokens: the length in bytes of its encoded
/// form (`encoded_len`; no tokenizer makes more tokens than bytes, and the
/// encoding's structure outweighs a chat template's), plus
/// [`MEDIA_TOKENS`] per media part and [`TOOLS_TOKENS`] when tools are
/// declared.
pub fn input_bound(request: &Request, encoded_len: usize) -> u64 {
    let media = request
        .messages()
        .iter()
        .flat_map(|message| message.parts())
        .filter(|part| matches!(part, Part::Media { .. }))
        .count() as u64;
    let tools = if request.tools().is_empty() {
        0
    } else {
        TOOLS_TOKENS
    };
    (encoded_len as u64)
        .saturating_add(media.saturating_mul(MEDIA_TOKENS))
        .saturating_add(tools)
}

fn meter(name: &str) -> Name {
    Name::new(name).expect("the meter names are valid")
}

/// What a call reserves: `input` and `max_tokens` of the token meters and,
/// with a price, their most expensive cost.
pub(crate) fn reservation(input: u64, max_tokens: u64, price: Option<&Price>) -> Meters {
    let mut reserve = Meters::from([
        (meter(TOKENS_IN), input),
        (meter(TOKENS_OUT), max_tokens),
        (meter(TOKENS), input.saturating_add(max_tokens)),
    ]);
    if let Some(price) = price {
        reserve.insert(meter(COST_MICROS), price.max_cost_micros(input, max_tokens));
    }
    reserve
}

/// What a settled call is charged: the reported usage, or, when the
/// provider reported none, the whole reservation.
pub(crate) fn charge(usage: Option<&Usage>, price: Option<&Price>, reserve: &Meters) -> Meters {
    let Some(usage) = usage else {
        return reserve.clone();
    };
    let mut charged = Meters::from([
        (meter(TOKENS_IN), usage.input_tokens),
        (meter(TOKENS_OUT), usage.output_tokens),
        (
            meter(TOKENS),
            usage.input_tokens.saturating_add(usage.output_tokens),
        ),
    ]);
    if let Some(price) = price {
        charged.insert(meter(COST_MICROS), price.cost_micros(usage));
    }
    charged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_the_ceiling_of_the_priced_sum() {
        let price = Price {
            input: 2_500_000,
            cached_input: Some(1_250_000),
            output: 10_000_000,
            reasoning: Some(12_000_000),
        };
        let usage = Usage {
            input_tokens: 1_000,
            output_tokens: 300,
            cached_input_tokens: 400,
            reasoning_tokens: 100,
        };
        // 600 × 2.5 + 400 × 1.25 + 200 × 10 + 100 × 12 = 1500 + 500 + 2000 + 1200.
        assert_eq!(price.cost_micros(&usage), 5_200);
        let odd = Usage {
            input_tokens: 1,
            output_tokens: 0,
            ..Usage::default()
        };
        assert_eq!(Price::per_million(1, 0).cost_micros(&odd), 1, "rounded up");
        assert_eq!(Price::per_million(0, 0).cost_micros(&usage), 0);
        assert_eq!(price.max_cost_micros(1_000, 300), 2_500 + 3_600);
    }
}
