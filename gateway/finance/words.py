"""The finance page's and statements' words in English or Korean, and the fonts that draw them.

A build (the page, a statement) runs in one language, chosen at the edge (``choose``: ``?lang=ko|en`` first,
else the best of ``Accept-Language``, else English) and set for the build on the report thread (``speaking``),
with the currency it shows (gateway.finance.money.shown_in). ``say`` gives a text in that language, with "USD"
named as the currency shown; a text the catalogue lacks stays in English (a test holds every text the pages say
to the catalogue). Figures, dates and names are never translated: a period reads "2026-12-01 to 2026-12-31" in
English and "2026-12-01 ~ 2026-12-31" in Korean (``period``).

``FONTS`` names fonts that hold Hangul before the generic family, so Korean tenants, tags and words are drawn,
not shown as boxes, where a system font lacks Hangul; the SVG charts take the same stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from gateway.errors import InvalidRequest
from gateway.finance import money

LANGS = ("en", "ko")
FONTS = ('system-ui,"Noto Sans KR","Noto Sans CJK KR","NanumGothic","Apple SD Gothic Neo","Malgun Gothic",'
         'sans-serif')
_lang: ContextVar[str] = ContextVar("tollgate_finance_lang", default="en")

KO = {
    # the page
    "Tollgate costs": "Tollgate 비용",
    "Calendar month {month}: {period} (UTC), against {before}": "{month} 한 달: {period} (UTC), {before}와 비교",
    "Last {days} days: {period} (UTC), against the {days} days before":
        "최근 {days}일: {period} (UTC), 그 전 {days}일과 비교",
    "Download CSV by day, tenant and model": "일·테넌트·모델별 CSV 내려받기",
    "Download every record (CSV)": "모든 기록 내려받기 (CSV)",
    "Sign out": "로그아웃",
    "Last": "최근",
    "days": "일",
    "Show": "보기",
    "Month": "월",
    "Spend (USD)": "지출 (USD)",
    "Requests": "요청 수",
    "Cost per 1,000 requests": "요청 1,000건당 비용",
    "Tokens per request p95": "요청당 토큰 p95",
    "Cache hits": "캐시 적중",
    "Tokens saved by the cache": "캐시로 절약한 토큰",
    "Spend by tenant": "테넌트별 지출",
    "Tenant": "테넌트",
    "Input tokens": "입력 토큰",
    "Output tokens": "출력 토큰",
    "Cached tokens": "캐시된 토큰",
    "Budget (USD)": "예산 (USD)",
    "Budget used (its period)": "예산 사용률 (해당 기간)",
    "Change vs the period before": "직전 기간 대비",
    "The policy names no tenant.": "정책에 테넌트가 없습니다.",
    "No requests in this range.": "이 기간에 요청이 없습니다.",
    "new": "신규",
    "Tenant {name}": "테넌트 {name}",
    "All tenants": "모든 테넌트",
    "By model": "모델별",
    "By key": "키별",
    "By day": "일별",
    "By cost centre (tags)": "비용 센터별 (태그)",
    "Model": "모델",
    "Key": "키",
    "Day": "일자",
    "Tags": "태그",
    "None.": "없음.",
    "Daily spend by tenant (USD)": "테넌트별 일일 지출 (USD)",
    "Daily spend by tenant": "테넌트별 일일 지출",
    "No spend in this range.": "이 기간에 지출이 없습니다.",
    "Top models": "상위 모델",
    "Prompt tokens": "프롬프트 토큰",
    "Completion tokens": "완성 토큰",
    "Cost (USD)": "비용 (USD)",
    "Per 1,000 requests": "요청 1,000건당",
    "No requests yet.": "아직 요청이 없습니다.",
    "Budget burn-down (this period)": "예산 소진 (이번 기간)",
    "Tenant or key": "테넌트 또는 키",
    "Period": "기간",
    "Spent (USD)": "지출 (USD)",
    "Limit (USD)": "한도 (USD)",
    "Used": "사용률",
    "No tenant or key has a budget.": "예산이 있는 테넌트나 키가 없습니다.",
    "day": "일",
    "month": "월",
    "Key {name} of {tenant}": "{tenant}의 키 {name}",
    "Recent anomalies and alerts": "최근 이상 징후와 알림",
    "Time": "시각",
    "Kind": "종류",
    "Action": "조치",
    "USD": "USD",
    "Statements for {month}, {whose}:": "{month} 명세서, {whose}:",
    "every tenant": "모든 테넌트",
    "tenant {name}": "테넌트 {name}",
    "printable": "인쇄용",
    "Excel": "엑셀",
    "Language": "언어",
    "Tollgate costs: sign in": "Tollgate 비용: 로그인",
    "Tollgate costs: busy": "Tollgate 비용: 처리 중",
    "Tollgate costs: check the period": "Tollgate 비용: 기간을 확인하세요",
    "Finance or admin token": "재무 또는 관리자 토큰",
    "Sign in": "로그인",
    "Sign in with single sign-on": "SSO로 로그인",
    "That token does not open the reports.": "그 토큰으로는 보고서를 열 수 없습니다.",
    "This page cannot show that.": "이 페이지는 그것을 보여 줄 수 없습니다.",
    "Show the last 30 days of every tenant": "모든 테넌트의 최근 30일 보기",
    "Another statement or report is being built in this gateway.":
        "이 게이트웨이에서 다른 명세서나 보고서를 만드는 중입니다.",
    "Its figures are read one build at a time;": "수치는 한 번에 하나씩 읽습니다.",
    "try again": "다시 시도",
    "in {seconds} seconds.": "({seconds}초 뒤)",
    # keys
    "(no key)": "(키 없음)",
    "(a key of the policy file)": "(정책 파일의 키)",
    "(unnamed)": "(이름 없음)",
    "Cache audit": "캐시 감사",
    "the response cache re-asking a sample of its hits at temperature 0 to check them, as batch work; metered to "
    "the tenant whose hits were checked":
        "응답 캐시가 적중한 답 가운데 표본을 temperature 0으로 다시 물어 확인하는 배치 작업으로, 확인한 적중의 "
        "테넌트에 계량됩니다",
    "(refused before a model)": "(모델 선택 전 거부)",
    "(untagged)": "(태그 없음)",
    "(no worker)": "(워커 없음)",
    # the GPU section
    "GPU cost": "GPU 비용",
    "GPU cost of {tenant}": "{tenant}의 GPU 비용",
    "GPU cost of {tenant} (USD)": "{tenant}의 GPU 비용 (USD)",
    "CSV by tenant": "테넌트별 CSV",
    "CSV by worker": "워커별 CSV",
    "What the workers cost by the hour (pools.<pool>.gpu_usd_per_hour), busy or not: each moment a worker ran "
    "requests is shared among the requests running then; the time it ran nothing is its idle cost, shown apart. "
    "Tenants plus idle equal the workers' hours at their rates.":
        "워커의 시간당 비용 (pools.<pool>.gpu_usd_per_hour)은 바쁘든 아니든 듭니다. 워커가 요청을 처리한 "
        "순간마다 그때 처리 중인 요청들이 나누어 부담하고, 아무것도 처리하지 않은 시간은 유휴 비용으로 따로 "
        "보입니다. 테넌트 합계와 유휴 비용을 더하면 워커 시간에 요금을 곱한 값과 같습니다.",
    "Only {tenant}'s share: each moment a worker ran its requests, shared among the requests running then. Other "
    "tenants' cost and the workers' idle hours are not this tenant's: they are on the all-tenants page.":
        "{tenant}의 몫만 보입니다: 워커가 이 테넌트의 요청을 처리한 순간마다 그때 처리 중인 요청들이 나누어 "
        "부담한 비용입니다. 다른 테넌트의 비용과 워커의 유휴 시간은 이 테넌트의 것이 아니며, 모든 테넌트 "
        "페이지에 있습니다.",
    "GPU cost: workers' hours (USD)": "GPU 비용: 워커 시간 (USD)",
    "Of it idle": "그중 유휴",
    "GPU cost by tenant, beside list-price spend": "테넌트별 GPU 비용과 정가 기준 지출",
    "GPU seconds": "GPU 초",
    "GPU cost (USD)": "GPU 비용 (USD)",
    "List-price spend (USD)": "정가 기준 지출 (USD)",
    "GPU cost per 1,000 requests": "요청 1,000건당 GPU 비용",
    "No worker time in this range.": "이 기간에 워커 시간이 없습니다.",
    "(idle) {worker}": "(유휴) {worker}",
    "GPU cost per 1,000 requests by tier": "등급별 요청 1,000건당 GPU 비용",
    "Tier": "등급",
    "Successful requests": "성공한 요청",
    "Utilisation by worker": "워커별 가동률",
    "Worker": "워커",
    "Pool": "풀",
    "USD per hour": "시간당 USD",
    "Hours paid": "지불한 시간",
    "Busy": "바쁨",
    "Idle": "유휴",
    "Of it down": "그중 중단",
    "Utilisation": "가동률",
    "Idle cost (USD)": "유휴 비용 (USD)",
    "No worker seen in this range.": "이 기간에 보인 워커가 없습니다.",
    "The cheapest configuration for this traffic": "이 트래픽에 가장 싼 구성",
    "met the TTFT objective": "TTFT 목표 충족",
    "missed the TTFT objective": "TTFT 목표 미달",
    ": a floor, as the objective was missed": ": 목표에 못 미쳤으므로 하한",
    "no TTFT": "TTFT 없음",
    "no saving": "절감 없음",
    "{amount} USD less": "{amount} USD 절감",
    "{amount} USD more: the pool was short": "{amount} USD 더 듦: 풀이 부족했음",
    "ran {ran} workers on average for {cost_ran} USD ({slo}: {p95}); for the same traffic the scaling rules would "
    "have run {needed} for {cost_needed} USD ({saving}{floor}), a worker at its scale-out mark holding {capacity} "
    "requests at once, the most one held.":
        "평균 {ran}대의 워커를 {cost_ran} USD에 돌렸습니다 ({slo}: {p95}). 같은 트래픽이라면 스케일링 규칙은 "
        "{needed}대를 {cost_needed} USD에 돌렸을 것입니다 ({saving}{floor}). 스케일아웃 기준에서 워커 한 대가 "
        "동시에 {capacity}개 요청을 처리하며, 이는 한 대가 처리한 최대치입니다.",
    # statements
    "Statement {month}": "{month} 명세서",
    "Statement {month} for {tenant}": "{tenant}의 {month} 명세서",
    "Summary by tenant": "테넌트별 요약",
    "Adjustments": "조정",
    "Records that reached a closed month after its close, carried here once.":
        "마감된 달에 마감 뒤 도착한 기록으로, 여기에 한 번 옮겨 적습니다.",
    "No adjustments.": "조정 없음.",
    "No requests.": "요청 없음.",
    "By cost centre": "비용 센터별",
    "GPU idle by worker": "워커별 GPU 유휴",
    "The workers' hours no request ran in: never spread over tenants.":
        "어떤 요청도 처리하지 않은 워커 시간으로, 테넌트에 나누지 않습니다.",
    "No worker hours.": "워커 시간 없음.",
    "Reconciliation": "대사",
    "Workers' hours at their rate (USD)": "워커 시간의 요금 합계 (USD)",
    "Tenants' GPU cost (USD)": "테넌트 GPU 비용 (USD)",
    "Idle GPU cost (USD)": "유휴 GPU 비용 (USD)",
    "Difference (USD)": "차이 (USD)",
    "Total": "합계",
    "CSV": "CSV",
    "Excel workbook": "엑셀 통합 문서",
    "Finance page": "재무 페이지",
    "Closed {at} by {by}: this statement no longer changes.": "{at}에 {by}가 마감: 이 명세서는 더 바뀌지 않습니다.",
    "Open: its figures may change until the month is closed.": "열림: 달이 마감될 때까지 수치가 바뀔 수 있습니다.",
    "Cost centre (tags)": "비용 센터 (태그)",
    "Adjustment": "조정",
    "Line": "항목",
    "For month": "대상 월",
    "Billable (USD)": "청구액 (USD)",
    "Adjustments (USD)": "조정 (USD)",
    "Configured hours": "설정된 시간",
    "Busy hours": "바쁜 시간",
    "Idle hours": "유휴 시간",
    "Workers' cost (USD)": "워커 비용 (USD)",
    "GPU cost here is this tenant's share of the workers' busy time alone: each moment a worker ran its requests, "
    "shared among the requests running then. Other tenants' cost and the workers' idle hours are not this "
    "tenant's; they are on the statement for every tenant.":
        "여기의 GPU 비용은 워커가 바빴던 시간 가운데 이 테넌트의 몫뿐입니다: 워커가 이 테넌트의 요청을 처리한 "
        "순간마다 그때 처리 중인 요청들이 나누어 부담한 비용입니다. 다른 테넌트의 비용과 워커의 유휴 시간은 이 "
        "테넌트의 것이 아니며, 모든 테넌트의 명세서에 있습니다.",
    "Item": "항목",
    "Value": "값",
    "Period (UTC)": "기간 (UTC)",
    "(all)": "(전체)",
    "Closed": "마감",
    "yes": "예",
    "no (figures may change until it is closed)": "아니요 (마감 전까지 수치가 바뀔 수 있음)",
    "Closed at": "마감 시각",
    "Closed by": "마감한 사람",
    "Rounding": "반올림",
    "Currency": "통화",
    "Statement": "명세서",
    "Each amount is rounded to the {unit} from the ledger's exact figure, half away from zero; a total is the exact "
    "sum rounded once, so the sum of its rounded lines may differ from it by up to half a {unit} for each line, "
    "and half a {unit} more.":
        "각 금액은 원장의 정확한 값에서 {unit} 단위로 반올림합니다(0.5는 0에서 먼 쪽으로). 합계는 정확한 합을 한 "
        "번 반올림한 값이므로, 반올림한 항목들의 합은 합계와 항목마다 최대 0.5{unit}, 그리고 0.5{unit}만큼 더 "
        "다를 수 있습니다.",
    "cent": "센트",
    "won": "원",
    "Amounts in {code}, converted from the ledger's {usd} at {rate} {code} per {usd} (the rate in force on {day}).":
        "금액은 {code}이며, 원장의 {usd}를 1 {usd}당 {rate} {code}({day}부터 적용되는 환율)로 환산했습니다.",
}


@contextmanager
def speaking(lang: str) -> Iterator[None]:
    """``say`` in ``lang`` (one of LANGS) within this block, on this thread."""
    token = _lang.set(lang if lang in LANGS else "en")
    try:
        yield
    finally:
        _lang.reset(token)


def lang() -> str:
    return _lang.get()


def say(text: str, **fields: object) -> str:
    """``text`` in the language spoken, "USD" named as the currency shown, then ``fields`` put in its braces."""
    out = KO.get(text, text) if _lang.get() == "ko" else text
    code = money.current().code
    if code != "USD":
        out = out.replace("USD", code)
    return out.format(**fields) if fields else out


def period(start: datetime, end: datetime) -> str:
    """A period's first and last day (gateway.finance.money.period), joined as the language joins them."""
    shown = money.period(start, end)
    return shown.replace(" to ", " ~ ") if _lang.get() == "ko" else shown


def choose(asked: str | None, accept: str | None) -> str:
    """The language a page is drawn in: ``?lang=`` when given (InvalidRequest unless one of LANGS), else the
    first of LANGS by the weights of ``Accept-Language`` (ko-KR counts as ko), else English."""
    if asked:
        if asked not in LANGS:
            raise InvalidRequest(f"lang takes one of {', '.join(LANGS)}, not '{asked[:20]}'.", "invalid_lang",
                                 param="lang")
        return asked
    best, weight = "en", 0.0
    for part in (accept or "")[:1000].split(",")[:50]:
        tag, _, params = part.strip().partition(";")
        primary = tag.strip().lower().split("-")[0]
        if primary not in LANGS:
            continue
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q > weight:
            best, weight = primary, q
    return best
