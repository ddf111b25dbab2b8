//! The strategy scenarios the command line demonstrates, run through the
//! facade: each ends in its documented result line.

use baton_examples::strategies::{Scenario, run};

#[tokio::test]
async fn every_strategy_scenario_prints_its_result_line() {
    for scenario in Scenario::ALL {
        let line = run(scenario).await.expect("the scenario completes");
        assert_eq!(line, scenario.expected(), "{}", scenario.name());
    }
}
