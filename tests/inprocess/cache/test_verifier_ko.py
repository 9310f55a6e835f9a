"""The near-miss verifier's Korean rules, one at a time: each pair differs by one thing the rule reads, and the
rephrasings beside it keep the answer. A rule that is dropped or reads a form wrong fails its test."""

from __future__ import annotations

import pytest

from gateway.cache.roles import conflict, korean_frame, opposite
from gateway.cache.verifier import _strip_particle, features, verify


def test_particles_are_stripped_longest_first_and_only_where_their_sound_fits() -> None:
    assert _strip_particle("서울에서는") == ("서울", "에서는", False)  # not 는 alone
    assert _strip_particle("부산으로") == ("부산", "으로", False)  # 으로 after a consonant
    assert _strip_particle("사이") == ("사이", None, False)  # 이 follows consonants only: 사이 keeps it
    assert _strip_particle("나라") == ("나라", None, False)  # 라 is no particle
    assert _strip_particle("고양이가") == ("고양이", "가", False)  # 가 after a vowel, and only it
    assert _strip_particle("사과를") == ("사과", "를", False) and _strip_particle("책을") == ("책", "을", False)
    assert _strip_particle("파일만") == ("파일", "만", True)  # "only"
    assert _strip_particle("비만") == ("비만", None, False)  # 만 ends the word, it is not "only"
    assert features("서울에서는 비가 와요?").tokens[0] == "서울"


def test_particles_give_roles_so_a_swap_of_source_and_destination_is_refused() -> None:
    """The roles come from the morphological analysis (gateway.cache.roles): two arguments trading roles is a
    near-miss ("role" when a subject is one of them, else "direction")."""
    swapped = {"direction", "role"}
    assert verify("달러를 원으로 바꾸면 얼마예요?", "원을 달러로 바꾸면 얼마예요?") == "direction"
    assert verify("부산에서 서울까지 얼마나 걸려요?", "서울에서 부산까지 얼마나 걸려요?") == "direction"
    assert verify("영희가 철수에게 보낸 편지", "철수가 영희에게 보낸 편지") in swapped
    assert verify("강아지가 고양이를 무서워하나요?", "고양이가 강아지를 무서워하나요?") in swapped
    assert verify("자바 코드를 파이썬으로 바꿔줘", "파이썬 코드를 자바로 바꿔줘") == "direction"
    assert verify("자바가 파이썬보다 빠른가요?", "파이썬이 자바보다 빠른가요?") in swapped
    assert verify("B팀이 A팀을 이겼어?", "A팀이 B팀을 이겼어?") in swapped  # the Latin part glued on
    assert verify("서울에서 부산까지 몇 시간 걸려요?", "부산까지 서울에서 몇 시간 걸려요?") is None  # order alone
    assert verify("고양이가 초콜릿 먹어도 되나요?", "고양이는 초콜릿을 먹어도 되나요?") is None  # particle changed


@pytest.mark.parametrize("negated", [
    "파일이 안 열려요",  # 안 V
    "파일을 못 열어요",  # 못 V
    "파일이 열리지 않아요",  # V-지 않다
    "파일을 열지 못해요",  # V-지 못하다
    "파일을 열 수 없어요",  # 없다
    "파일이 열리는 게 아니에요",  # 아니다
    "파일 열지 마",  # -지 마 (말다)
    "파일 열지마세요",  # glued
])
def test_each_negation_form_is_read(negated: str) -> None:
    assert features(negated).negations == 1
    plain = "파일이 열려요"
    assert verify(negated, plain) == "negation"


def test_negation_markers_are_not_read_inside_other_words() -> None:
    assert features("폴더 안에 있는 파일").negations == 0  # 안 "inside"
    assert features("잘못 입력한 비밀번호").negations == 0  # 잘못 "wrongly"
    assert verify("노트북이 충전이 안 됩니다", "노트북이 충전이 안 돼요") is None


@pytest.mark.parametrize("buy, sell", [
    ("비트코인 지금 살까요?", "비트코인 지금 팔까요?"),
    ("집을 삽니다", "집을 팝니다"),
    ("주식을 샀어요", "주식을 팔았어요"),
    ("중고차 사는 법", "중고차 파는 법"),
    ("블루투스 켜는 법", "블루투스 끄는 법"),
    ("에어컨 켜줘", "에어컨 꺼줘"),
    ("볼륨 올려 주세요", "볼륨 내려 주세요"),
    ("메모리 늘리는 방법", "메모리 줄이는 방법"),
    ("포트를 여는 방법", "포트를 닫는 방법"),
    ("가장 빠른 길", "가장 느린 길"),
    ("더 쉬운 언어", "더 어려운 언어"),
    ("그 사람 알아?", "그 사람 몰라?"),
])
def test_antonym_stems_are_matched_across_conjugations(buy: str, sell: str) -> None:
    assert verify(sell, buy) == "antonym"


def test_a_verb_form_is_not_read_inside_a_noun() -> None:
    assert "사다" not in features("사과 3개").tokens  # 사과 "apple" is not 사 + ending
    assert "팔다" not in features("파이썬 설치").tokens  # 파 needs an ending to be 팔다
    assert "알다" not in features("다섯 살 아이").tokens  # 알다 drops its ㄹ only before ㄴ, ㅂ, ㅅ, 오
    assert "알다" in features("아는 사람").tokens


def test_a_verb_with_a_favour_is_a_verb_of_its_own_only_where_the_lexicon_pairs_it() -> None:
    lend, borrow = korean_frame("빌려주는 사람"), korean_frame("빌리는 사람")
    assert lend is not None and borrow is not None and opposite(*lend.predicates, *borrow.predicates)
    assert conflict(korean_frame("서류를 보내 주는 방법"), korean_frame("서류를 보내는 방법")) is None
    assert verify("비트코인 어떻게 사?", "비트코인을 어떻게 사나요?") is None


@pytest.mark.parametrize("text, number", [
    ("사과 세 개", "3"), ("사과 3개", "3"), ("사과 세개", "3"), ("다섯 살 아이", "5"), ("일곱 시에 깨워줘", "7"),
    ("삼십 분 뒤", "30"), ("이십만 원", "200000"), ("5만 원", "50000"), ("스물다섯 살", "25"), ("책 두 권", "2"),
    ("커피 한 잔", "1"), ("2인분", "2"), ("열 번 반복", "10"), ("오 분 타이머", "5"),
])
def test_korean_numerals_native_and_sino_with_counters(text: str, number: str) -> None:
    assert features(text).numbers == (number,)


def test_numeral_syllables_in_ordinary_words_are_not_numbers() -> None:
    for text in ("이번 주 일정", "창문을 열어 두세요", "세대 차이", "사용 방법", "일부 파일", "한국 음식",
                 "네, 알겠습니다"):
        assert features(text).numbers == (), text
    assert verify("사과 3개에 얼마예요?", "사과 세 개에 얼마예요?") is None
    assert verify("아메리카노 네 잔", "아메리카노 세 잔") == "number"


def test_bounds_are_comparatives_only_after_a_number() -> None:
    assert verify("키가 180 이하인 사람", "키가 180 이상인 사람") == "comparative"
    assert verify("만 19세 미만 가입", "만 19세 이상 가입") == "comparative"
    assert features("이상한 소리가 나요").comparatives == frozenset()


def test_time_words_and_this_next_last_written_as_one_word_or_two() -> None:
    assert verify("내일 서울 날씨", "오늘 서울 날씨") == "time"
    assert verify("다음 주 일정 알려줘", "이번 주 일정 알려줘") == "time"
    assert verify("지난달 카드값", "이번 달 카드값") == "time"
    assert verify("이번주 일정 알려줘", "이번 주 일정 알려줘") is None
    assert verify("저번 달 카드값", "지난달 카드값") is None


def test_quantifiers_and_only() -> None:
    assert verify("일부 직원에게 공지", "전체 직원에게 공지") == "quantifier"
    assert verify("현재 탭만 닫기", "모든 탭 닫기") in ("quantifier", "time")
    assert verify("카톡 알림만 끄기", "모든 알림 끄기") == "quantifier"
    assert verify("각 행의 합계", "전체 행의 합계") == "quantifier"


def test_loanwords_read_as_their_latin_names() -> None:
    assert verify("iPhone 15 가격", "아이폰 15 가격") is None
    assert verify("Kubernetes 파드 재시작", "쿠버네티스 파드 재시작") is None
    assert verify("git 브랜치 삭제", "깃 브랜치 삭제") is None
    assert verify("Docker 설치 방법", "쿠버네티스 설치 방법") == "entity"


def test_registers_and_spacing_do_not_change_the_question() -> None:
    assert verify("이 오류 어떻게 해결해요?", "이 오류는 어떻게 해결합니까?") is None
    assert verify("서울에서 부산까지 얼마나 걸립니까?", "서울에서 부산까지 얼마나 걸려요?") is None
    assert verify("김치찌개만드는법", "김치찌개 만드는 법") is None
    assert verify("파이썬설치방법", "파이썬 설치 방법") is None
    assert verify("비밀번호를 잊어버렸습니다", "비밀번호를 잊어버렸어요") is None


def test_a_swapped_korean_content_word_is_refused() -> None:
    assert verify("부산 날씨 알려줘", "서울 날씨 알려줘") == "entity"
    assert verify("이순신이 만든 것", "장영실이 만든 것") == "substitution"
    assert verify("맥북 프로 무게", "맥북 에어 무게") == "substitution"


def test_mixed_korean_and_english() -> None:
    assert verify("Java에서 int를 String으로 변환", "Java에서 String을 int로 변환") == "direction"
    assert verify("Docker 컨테이너 중지하는 명령어", "Docker 컨테이너 시작하는 명령어") == "antonym"
    assert verify("Node.js 20 설치", "Node.js 18 설치") == "number"
    assert verify("Linux에서 방화벽 끄기", "Linux에서 방화벽 켜기") == "antonym"
