"""The tiny tool-use task: the teacher's habit that SFT copies, and what an episode answers it."""

from trainer.config.environment import EnvironmentConfig
from trainer.data.tool_calls import plain_messages
from trainer.rollout.builder import build_agent
from trainer.tiny.agent_task import HABIT_DIGITS, problems, teacher_slips, trace
from trainer.tiny.model import build_tokenizer


def test_the_teacher_slips_only_where_the_first_number_is_even_and_not_always():
    assert HABIT_DIGITS == "02468"
    items = problems()[64:1064]  # the SFT traces' problems
    habit = [prompt for prompt, _ in items if int(prompt.split("*")[0]) % 2 == 0]
    slips = [prompt for prompt, _ in items if teacher_slips(prompt)]
    assert set(slips) <= set(habit)
    assert 0.5 < len(slips) / len(habit) < 0.7  # mostly, so SFT's greedy call slips; not always, so GRPO can explore


def test_a_slipped_trace_holds_what_the_environment_answers_its_call_and_then_the_answer():
    prompt, answer = next((prompt, answer) for prompt, answer in problems() if teacher_slips(prompt))
    messages = trace(prompt, answer)["messages"]
    call_turn = plain_messages(messages)[1]["content"]
    assert prompt[:-1].replace("*", "x") in call_turn

    agent = build_agent(EnvironmentConfig(name="tiny_calculator"), build_tokenizer())
    episode = agent.start({"prompt": messages[:1], "answer": answer})
    observation = episode.environment.step(call_turn)  # the call as SFT teaches the model to write it
    assert observation.num_tool_errors == 1 and not observation.done
    assert observation.messages == [messages[2]] == [{"role": "tool", "content": "error: calculator: ValueError: "
                                                                                 "not arithmetic"}]
    assert messages[3] == {"role": "assistant", "content": answer}  # the teacher answers from memory
